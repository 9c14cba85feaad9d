"""Every answer says which adapter version served it (``x-preft-adapter*`` headers), so a
client can tell whether a hot swap has reached its request (the soak test checks this), and
an answer from the base model says so. No request that names an adapter the way another
server does (LoRAX's ``adapter_id``) is silently answered by the base model."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from fastapi.testclient import TestClient

from preft_serve.common.registry_client import RegistryKeys
from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, MSGS, SHA, FakeRegistry, Workers
from tests.support.ports import free_port

HEADERS = ("x-preft-adapter", "x-preft-adapter-version", "x-preft-adapter-sha256")


@pytest.fixture
def workers() -> Workers:
    return Workers()


@pytest.fixture
def client(workers: Workers) -> Iterator[TestClient]:
    settings = GatewaySettings(
        worker_urls=["http://w1:8000"], base_model_name="tiny", worker_base_model="/models/tiny"
    )
    app = create_app(settings, transport=httpx.MockTransport(workers), registry=FakeRegistry())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_adapter_answers_name_version_and_hash(client: TestClient, stream: bool, path: str) -> None:
    body = {"messages": MSGS} if "chat" in path else {"prompt": "hi"}
    resp = client.post(path, json={**body, "user": "u1", "stream": stream}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    assert [resp.headers[h] for h in HEADERS] == ["bot", "1", SHA]


def test_base_model_and_errors_name_no_adapter(client: TestClient) -> None:
    base = client.post(
        "/v1/chat/completions", json={"messages": MSGS, "model": "tiny"}, headers=AUTH
    )
    assert base.status_code == 200
    unbound = client.post(
        "/v1/chat/completions", json={"messages": MSGS, "user": "u2"}, headers=AUTH
    )
    assert unbound.status_code == 404
    assert base.headers["x-preft-adapter"] == "none"
    assert not any(h in base.headers for h in HEADERS[1:])
    assert not any(h in unbound.headers for h in HEADERS)


@pytest.mark.parametrize("model", [None, "tiny", "bot"])
def test_loraxs_adapter_id_names_the_adapter_like_model(
    client: TestClient, workers: Workers, model: str | None
) -> None:
    resp = client.post(
        "/v1/chat/completions",
        headers=AUTH,
        json={"messages": MSGS, "adapter_id": "bot", **({"model": model} if model else {})},
    )
    assert resp.status_code == 200, resp.text
    assert [resp.headers[h] for h in HEADERS] == ["bot", "1", SHA]
    assert workers.seen[-1]["model"] == f"sha256:{SHA}"
    assert "adapter_id" not in workers.seen[-1]


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"adapter_id": "bot", "model": "other"}, "adapter_id", "name different models"),
        ({"adapter_id": 7}, "adapter_id", "must be an adapter's name"),
        ({"adapter_id": "x" * 300}, "adapter_id", "300 characters"),
        ({"adapter_id": "bot", "adapter_source": "hub"}, "adapter_source", "uploaded to the"),
        (
            {"model": "tiny", "merged_adapters": {"ids": ["a", "b"]}},
            "merged_adapters",
            "is not supported",
        ),
    ],
)
def test_adapter_fields_the_gateway_cannot_honour_are_refused_not_ignored(
    client: TestClient, workers: Workers, extra: dict[str, object], param: str, says: str
) -> None:
    resp = client.post(
        "/v1/chat/completions", headers=AUTH, json={"messages": MSGS, "user": "u1", **extra}
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and says in error["message"], error
    assert workers.seen == []


def test_another_tenants_adapter_by_adapter_id_is_not_found(
    client: TestClient, workers: Workers
) -> None:
    resp = client.post(
        "/v1/chat/completions", headers=AUTH, json={"messages": MSGS, "adapter_id": "rival"}
    )
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
    assert workers.seen == []


@pytest.mark.parametrize("field", ["lora_request", "lora_name", "lora", "adapter", "adapters"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_other_servers_adapter_fields_are_refused_with_what_to_use_instead(
    client: TestClient, workers: Workers, field: str, path: str
) -> None:
    """vLLM's, LoRAX's and other proxies' ways to pick an adapter: a 400 that names the
    field and the way to do it here, never a base-model answer (nothing is charged)."""
    body = {"messages": MSGS} if "chat" in path else {"prompt": "hi"}
    resp = client.post(path, headers=AUTH, json={**body, "model": "tiny", field: "bot"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == field and error["code"] == "unsupported_parameter"
    assert f"'{field}' is not supported" in error["message"]
    assert "'model'" in error["message"] and "'user'" in error["message"]
    assert workers.seen == [] and "x-preft-adapter" not in resp.headers


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_adapter_id_on_both_routes_streams_and_says_which_adapter(
    client: TestClient, workers: Workers, path: str
) -> None:
    body = {"messages": MSGS} if "chat" in path else {"prompt": "hi"}
    resp = client.post(path, headers=AUTH, json={**body, "adapter_id": "bot", "stream": True})
    assert resp.status_code == 200, resp.text
    assert [resp.headers[h] for h in HEADERS] == ["bot", "1", SHA]
    assert '"model": "bot"' in resp.text or '"model":"bot"' in resp.text
    assert workers.seen[-1]["model"] == f"sha256:{SHA}"


def _gateway(redis_url: str, namespace: str) -> TestClient:
    settings = GatewaySettings(
        worker_urls=["http://w1:8000"],
        base_model_name="tiny",
        namespace=namespace,
        limits_cache_s=0,
        ratelimit_timeout_s=5,
    )
    app = create_app(
        settings,
        transport=httpx.MockTransport(Workers()),
        registry=FakeRegistry(),
        redis_client=aioredis.Redis.from_url(redis_url),
    )
    return TestClient(app, raise_server_exceptions=False)


def test_the_tenants_unbound_user_setting_decides_base_model_or_404(redis_server: str) -> None:
    """Read from the tenant's record in the registry's Redis (where ``PATCH
    /v1/tenants/{tenant}`` writes it); the default is the base model."""
    namespace = f"ub{uuid.uuid4().hex[:8]}"
    record = RegistryKeys(namespace).tenant("acme")
    store = redis.Redis.from_url(redis_server)
    body = {"model": "tiny", "messages": MSGS, "user": "u2"}
    try:
        with _gateway(redis_server, namespace) as client:
            served = client.post("/v1/chat/completions", headers=AUTH, json=body)
            assert served.status_code == 200 and served.headers["x-preft-adapter"] == "none"
            store.hset(record, "unbound_user", "not_found")
            refused = client.post("/v1/chat/completions", headers=AUTH, json=body)
            assert refused.status_code == 404, refused.text
            assert refused.json()["error"]["code"] == "adapter_binding_not_found"
            assert "x-preft-adapter" not in refused.headers
            bound = client.post("/v1/chat/completions", headers=AUTH, json={**body, "user": "u1"})
            assert bound.status_code == 200 and bound.headers["x-preft-adapter"] == "bot"
            store.hset(record, "unbound_user", "base_model")
            again = client.post("/v1/chat/completions", headers=AUTH, json=body)
            assert again.status_code == 200 and again.headers["x-preft-adapter"] == "none"
    finally:
        store.delete(record)
        store.close()


def test_an_unreadable_setting_falls_back_to_the_default() -> None:
    """Redis down: the default (the base model, which says so), not an error for every
    request the gateway can still serve."""
    with _gateway(f"redis://127.0.0.1:{free_port()}/0", "ub") as client:
        resp = client.post(
            "/v1/chat/completions",
            headers=AUTH,
            json={"model": "tiny", "messages": MSGS, "user": "u2"},
        )
    assert resp.status_code == 200 and resp.headers["x-preft-adapter"] == "none"
