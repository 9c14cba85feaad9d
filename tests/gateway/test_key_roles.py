"""The gateway enforces API key roles, refuses expired keys from its cache, drops a
revoked key within a second, and records a key's last use off the request's path; keys
are written by the registry's own service code on a real Redis."""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from preft_serve.common import key_roles
from preft_serve.common.key_roles import KeyRole
from preft_serve.common.registry_client import core as client_core
from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.registry.api_keys import KeySpec
from tests.support.gateway import MSGS, Workers
from tests.support.registry_writer import Writer, eventually

# (method, path, body, action in the refusal, least role): written out here, independent
# of the table in preft_serve.common.key_roles.
ROUTES: list[tuple[str, str, dict[str, Any] | None, str, str]] = [
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": MSGS}, "", "inference"),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": "hi"}, "", "inference"),
    ("GET", "/v1/models", None, "", "inference"),
    ("POST", "/tokenize", {"model": "tiny", "prompt": "hi"}, "", "inference"),
    ("GET", "/version", None, "", "inference"),
    ("GET", "/v1/files", None, "read files", "developer"),
    ("GET", "/v1/fine_tuning/jobs", None, "read fine-tuning jobs", "developer"),
    ("DELETE", "/v1/models/bot", None, "upload or change adapters", "developer"),
    ("GET", "/v1/audit", None, "read the audit log", "admin"),
]
RANK = {"inference": 0, "developer": 1, "admin": 2}


class Gateway:
    def __init__(self, client: TestClient, writer: Writer) -> None:
        self.client = client
        self.writer = writer
        self.keys: dict[str, tuple[str, str]] = {}  # role -> (key id, API key)

    def key(self, role: str, expires: dt.datetime | None = None) -> tuple[str, str]:
        made = self.writer.tenants.create_key("acme", KeySpec(KeyRole(role), None, expires))
        return made.key_id, made.api_key

    def get(self, api_key: str, path: str = "/v1/models") -> httpx.Response:
        return self.client.get(path, headers={"Authorization": f"Bearer {api_key}"})


@pytest.fixture
def gateway(redis_server: str) -> Iterator[Gateway]:
    namespace = f"kr{uuid.uuid4().hex[:8]}"
    writer = Writer(redis_server, namespace)
    writer.tenants.create("acme")
    settings = GatewaySettings(
        worker_urls=["http://w1:8000"],
        base_model_name="tiny",
        redis_url=redis_server,
        namespace=namespace,
    )
    app = create_app(settings, transport=httpx.MockTransport(Workers()))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield Gateway(client, writer)
    for key in writer.redis.scan_iter(f"{namespace}:*"):
        writer.redis.delete(key)


@pytest.mark.parametrize("role", list(RANK))
def test_each_role_against_each_gateway_route(gateway: Gateway, role: str) -> None:
    _, api_key = gateway.key(role)
    for method, path, body, action, least in ROUTES:
        resp = gateway.client.request(
            method, path, json=body, headers={"Authorization": f"Bearer {api_key}"}
        )
        if RANK[role] >= RANK[least]:
            assert resp.status_code not in (401, 403), (path, resp.text)
            continue
        assert resp.status_code == 403, (path, resp.text)
        error = resp.json()["error"]
        assert (error["code"], error["type"]) == ("insufficient_role", "permission_error")
        roles = "developer or admin" if least == "developer" else "admin"
        assert error["message"] == (
            f"this key's role '{role}' cannot {action}; use a key with role {roles}"
        )
    metrics = gateway.client.get("/metrics").text
    refused = sum(RANK[role] < RANK[least] for *_, least in ROUTES)
    line = 'preft_gateway_errors_total{cause="insufficient_role"}'
    assert (f"{line} {float(refused)}" in metrics) == bool(refused), metrics


def test_a_revoked_key_is_refused_within_a_second(gateway: Gateway) -> None:
    key_id, api_key = gateway.key("developer")
    assert gateway.get(api_key).status_code == 200
    assert gateway.get(api_key).status_code == 200  # now answered from the cache
    assert gateway.client.app.state.gateway.registry.cache_sizes()["api_keys"] >= 1  # type: ignore[attr-defined]
    start = time.monotonic()
    gateway.writer.tenants.revoke_key("acme", key_id)
    while (resp := gateway.get(api_key)).status_code == 200 and time.monotonic() - start < 5:
        time.sleep(0.005)
    elapsed = time.monotonic() - start
    assert resp.status_code == 401, resp.text
    assert resp.json()["error"]["code"] == "invalid_api_key"
    assert elapsed < 1.0, f"revoked key still served {elapsed:.3f} s after revocation"


def test_an_expired_key_is_refused_from_the_cache(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=60)
    _, api_key = gateway.key("inference", expires)
    assert gateway.get(api_key).status_code == 200
    assert gateway.get(api_key).status_code == 200  # cached

    class Later:
        """The clock a minute and a second on; nothing in Redis changes."""

        @staticmethod
        def time() -> float:
            return time.time() + 61

    monkeypatch.setattr(client_core, "time", Later)
    resp = gateway.get(api_key)
    assert resp.status_code == 401
    assert resp.json()["error"]["message"] == (
        "invalid API key (unknown, revoked or expired): use a valid key issued by the "
        "registry for your tenant"
    )
    monkeypatch.undo()
    assert gateway.get(api_key).status_code == 200  # the same key, before its expiry


def test_last_use_is_written_in_the_background_once_a_minute(gateway: Gateway) -> None:
    key_id, api_key = gateway.key("inference")
    use = gateway.writer.keys.key_use("acme")
    start = dt.datetime.now(dt.UTC).replace(microsecond=0)
    assert gateway.get(api_key).status_code == 200
    first = eventually(lambda: gateway.writer.redis.hget(use, key_id))
    assert first is not None
    assert start <= dt.datetime.fromisoformat(first) <= dt.datetime.now(dt.UTC)
    assert 0 < gateway.writer.redis.ttl(use) <= 400 * 86400
    gateway.writer.redis.hset(use, key_id, "marker")
    for _ in range(3):
        assert gateway.get(api_key).status_code == 200
    time.sleep(0.2)
    assert gateway.writer.redis.hget(use, key_id) == "marker"  # within the minute: no write
    listed = {k.key_id: k.last_used_at for k in gateway.writer.tenants.list_keys("acme")}
    assert listed[key_id] == "marker"


def test_a_redis_error_writing_last_use_does_not_fail_the_request(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    key_id, api_key = gateway.key("inference")
    registry = gateway.client.app.state.gateway.registry  # type: ignore[attr-defined]

    def broken(owner: Any) -> Iterator[Any]:
        raise redis.ConnectionError("Redis went away")
        yield  # a generator, like the operation it replaces

    monkeypatch.setattr(registry, "_record_use", broken)
    with caplog.at_level(logging.WARNING):
        resp = gateway.client.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": MSGS},
            headers={"Authorization": f"Bearer {api_key}"},
        )
        assert resp.status_code == 200, resp.text
        assert eventually(lambda: "could not record the use of key" in caplog.text)
    assert f"key {key_id}: Redis went away" in caplog.text
    assert gateway.writer.redis.hget(gateway.writer.keys.key_use("acme"), key_id) is None


@pytest.mark.parametrize(
    ("template", "url", "role", "refused"),
    [
        ("/v1/adapters/{rest:path}", "/v1/adapters/x/policy", "inference", True),
        ("/v1/adapters/{rest:path}", "/v1/adapters/x/policy", "developer", False),
        ("/v1/{rest:path}", "/v1/audit", "developer", True),  # a catch-all: the path decides
        ("/v1/{rest:path}", "/v1/chat/completions", "inference", False),
        ("/tokenize", "/tokenize", "inference", False),
        ("/v1/tenant-settings", "/v1/tenant-settings", "developer", True),  # unlisted: admin
        ("/v1/tenant-settings", "/v1/tenant-settings", "admin", False),
    ],
)
def test_routes_are_classified_by_family_and_unlisted_ones_need_admin(
    template: str, url: str, role: str, refused: bool
) -> None:
    path = key_roles.route_path(template, url)
    if refused:
        with pytest.raises(key_roles.InsufficientRole):
            key_roles.check(KeyRole(role), "GET", path)
    else:
        key_roles.check(KeyRole(role), "GET", path)
