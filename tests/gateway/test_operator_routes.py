"""The operator routes: the admin token reads the gateway's workers (health, load, resident
adapters), its routing's warm-hit share and the registry's tenants; a tenant's key, any
other token or none is refused, and a gateway without an admin token serves none of it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.finetune.conftest import ADMIN_TOKEN
from tests.gateway import test_registry_slots as slots
from tests.gateway.test_registry_slots import Stack
from tests.support.gateway import AUTH, KEY, MSGS, OTHER_KEY, SHA, FakeRegistry
from tests.support.inprocess import serving

model_dir, stack = slots.model_dir, slots.stack  # a real registry behind a gateway

TOKEN = "operator-token-0123456789"
WARM = "http://w1:8000"  # has 'bot' (SHA) loaded
DOWN = "http://w2:8000"  # fails its health check
BUSY = "http://ops:s3cret@w3:8000"  # one request of another gateway's; a password in its URL
OPERATOR_ROUTES = ("/v1/operator/workers", "/v1/operator/routing", "/v1/tenants")


def _worker(request: httpx.Request) -> httpx.Response:
    host, path = request.url.host, request.url.path
    if path == "/health":
        return httpx.Response(503 if host == "w2" else 200)
    if path == "/v1/models":
        data = [{"id": f"sha256:{SHA}"}] if host == "w1" else []
        return httpx.Response(200, json={"object": "list", "data": data})
    if path == "/metrics":
        running = 1 if host == "w3" else 0
        page = f'vllm:num_requests_running{{engine="0"}} {running}.0\n'
        return httpx.Response(200, text=page + 'vllm:num_requests_waiting{engine="0"} 0.0\n')
    answer = {"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 1}}
    return httpx.Response(200, json={"model": "m", **answer})


def _gateway(**settings: object) -> FastAPI:
    defaults: dict[str, object] = {
        "worker_urls": [WARM, DOWN, BUSY],
        "base_model_name": "tiny",
        "unhealthy_after": 1,
        "admin_token": TOKEN,
    }
    return create_app(
        GatewaySettings(**{**defaults, **settings}),  # type: ignore[arg-type]
        transport=httpx.MockTransport(_worker),
        registry=FakeRegistry(),
    )


def _admin(client: httpx.Client, path: str, **params: Any) -> dict[str, Any]:
    reply = client.get(path, params=params, headers={"Authorization": f"Bearer {TOKEN}"})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_the_admin_reads_each_workers_health_load_and_resident_adapters() -> None:
    with serving(_gateway()) as url, httpx.Client(base_url=url, timeout=10) as client:
        deadline = time.monotonic() + 10
        while (rows := _admin(client, "/v1/operator/workers")["data"])[2]["others"] != 1:
            assert time.monotonic() < deadline, rows
            time.sleep(0.05)
        page = _admin(client, "/v1/operator/workers")
        assert (page["pool"], page["total"], page["healthy"], page["has_more"]) == (
            "prefill",
            3,
            2,
            False,
        )
        seen = {
            w["url"]: (w["healthy"], w["resident"], w["resident_count"], w["others"])
            for w in page["data"]
        }
        assert seen == {
            "http://w1:8000": (True, [SHA], 1, 0),
            "http://w2:8000": (False, [], 0, 0),
            "http://w3:8000": (True, [], 0, 1),  # the password is not shown
        }
        assert (
            "s3cret"
            not in client.get(
                "/v1/operator/workers", headers={"Authorization": f"Bearer {TOKEN}"}
            ).text
        )

        # Pages of one follow each other to the same three workers; the shas are bounded.
        urls, after = [], None
        while True:
            one = _admin(
                client, "/v1/operator/workers", limit=1, **({"after": after} if after else {})
            )
            urls += [w["url"] for w in one["data"]]
            if (after := one["last"]) is None:
                assert not one["has_more"]
                break
        assert urls == ["http://w1:8000", "http://w2:8000", "http://w3:8000"]
        first = _admin(client, "/v1/operator/workers", adapters=0)["data"][0]
        assert (first["resident"], first["resident_count"]) == ([], 1)

        # No decode pool on this gateway: its page is a 404, and no handoffs.
        none = client.get(
            "/v1/operator/workers",
            params={"pool": "decode"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert none.status_code == 404 and none.json()["error"]["code"] == "no_decode_pool"


def test_the_warm_hit_share_counts_requests_sent_where_the_adapter_was_loaded() -> None:
    with serving(_gateway()) as url, httpx.Client(base_url=url, timeout=10) as client:
        before = _admin(client, "/v1/operator/routing")
        assert before["warm_hit_share"] is None and sum(before["decisions"].values()) == 0
        # 'bot' is loaded on w1 (three requests: warm hits); 'rival' is loaded nowhere.
        for _ in range(3):
            sent = client.post(
                "/v1/chat/completions", headers=AUTH, json={"messages": MSGS, "user": "u1"}
            )
            assert sent.status_code == 200, sent.text
        cold = {"Authorization": f"Bearer {OTHER_KEY}"}
        sent = client.post(
            "/v1/chat/completions", headers=cold, json={"messages": MSGS, "user": "u9"}
        )
        assert sent.status_code == 200, sent.text
        after = _admin(client, "/v1/operator/routing")
        assert after["decisions"] == {"resident": 3, "preferred": 1, "replica": 0, "spill": 0}
        assert after["warm_hit_share"] == pytest.approx(3 / 4)
        assert after["handoffs"] == {
            "decoded": 0,
            "first_token": 0,
            "fallback": 0,
            "decode_failed": 0,
        }
        assert after["decode_pool"] is False


@pytest.mark.parametrize("path", OPERATOR_ROUTES)
def test_a_tenant_key_another_token_or_none_is_refused(path: str) -> None:
    with serving(_gateway()) as url, httpx.Client(base_url=url, timeout=10) as client:
        for headers, code in (
            (AUTH, "invalid_admin_token"),  # a valid tenant key (role admin in its tenant)
            ({"Authorization": f"Bearer {KEY}x"}, "invalid_admin_token"),
            ({"Authorization": f"Bearer {TOKEN[:-1]}"}, "invalid_admin_token"),
            ({}, "missing_admin_token"),
        ):
            reply = client.get(path, headers=headers)
            assert reply.status_code == 401, (headers, reply.text)
            assert reply.json()["error"]["code"] == code
            assert TOKEN not in reply.text


def test_without_an_admin_token_the_operator_routes_are_not_served() -> None:
    app = _gateway(admin_token=None)
    with serving(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        for path in OPERATOR_ROUTES:
            reply = client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert reply.status_code == 501, reply.text
            assert reply.json()["error"]["code"] == "operator_not_configured"


def test_tenants_and_quotas_through_the_gateway_are_the_registrys(
    stack: Callable[..., Stack],
) -> None:
    s = stack(admin_token=ADMIN_TOKEN)
    acme = s.registry.tenant("acme")
    s.registry.tenant("globex")
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    quota = httpx.patch(
        f"{s.registry.url}/v1/tenants/acme",
        json={"quota": {"max_adapters": 7}},
        headers=admin,
        timeout=30,
    )
    assert quota.status_code == 200, quota.text
    limits = httpx.put(
        f"{s.registry.url}/v1/tenants/acme/limits",
        json={"tenant_rps": 42.0},
        headers=admin,
        timeout=30,
    )
    assert limits.status_code == 200, limits.text

    listed = s.call(ADMIN_TOKEN, "GET", "/v1/tenants")
    assert listed.status_code == 200, listed.text
    assert listed.json() == s.registry.call(ADMIN_TOKEN, "GET", "/v1/tenants").json()
    quotas = {t["name"]: t["quota"]["max_adapters"] for t in listed.json()}
    assert quotas == {"acme": 7, "globex": None}
    for path in ("/v1/tenants/acme", "/v1/tenants/acme/limits", "/v1/tenants/acme/keys"):
        through, direct = (
            s.call(ADMIN_TOKEN, "GET", path),
            s.registry.call(ADMIN_TOKEN, "GET", path),
        )
        assert through.status_code == direct.status_code == 200, through.text
        assert through.json() == direct.json()
    assert s.call(ADMIN_TOKEN, "GET", "/v1/tenants/acme/limits").json()["tenant_rps"] == 42.0
    assert "api_key" not in s.call(ADMIN_TOKEN, "GET", "/v1/tenants/acme").text

    # The registry's own 404 comes back; writes are not forwarded; a tenant key is a 401.
    missing = s.call(ADMIN_TOKEN, "GET", "/v1/tenants/nobody")
    assert missing.status_code == 404, missing.text
    created = s.call(ADMIN_TOKEN, "POST", "/v1/tenants", json={"name": "initech"})
    assert created.status_code == 405, created.text
    assert "initech" not in {t["name"] for t in s.call(ADMIN_TOKEN, "GET", "/v1/tenants").json()}
    assert s.call(acme, "GET", "/v1/tenants").status_code == 401
    assert s.call(acme, "GET", "/v1/tenants/acme").status_code == 401
