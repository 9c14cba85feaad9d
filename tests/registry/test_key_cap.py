"""A tenant holds at most ``tenant_max_keys`` API keys: ``POST /v1/keys`` past it is a 409
saying to revoke unused keys, nothing is stored, and revoking one frees its slot (revoked
keys are deleted). The count is read under WATCH, so concurrent creations cannot pass it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import redis
from fastapi.testclient import TestClient

from preft_serve.common.domain_errors import Conflict
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry.api_keys import KeySpec
from preft_serve.registry.tenants import TenantService
from tests.support.registry_api import admin, bearer, create_tenant

CAP = 3


def _create(client: TestClient, headers: dict[str, str]) -> Any:
    return client.post("/v1/keys", json={"role": "inference"}, headers=headers)


def test_a_key_past_the_cap_is_refused_and_nothing_is_stored(
    make_client: Callable[..., TestClient],
    redis_client: redis.Redis,
    namespace: str,
) -> None:
    client = make_client(tenant_max_keys=CAP)
    acme = create_tenant(client, "acme")  # the tenant's first key: 1 of CAP
    made = [_create(client, acme) for _ in range(CAP - 1)]
    assert [r.status_code for r in made] == [201] * (CAP - 1)
    keys_key = RegistryKeys(namespace).tenant_keys("acme")
    before = redis_client.hgetall(keys_key)
    assert len(before) == CAP
    refused = _create(client, acme)
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "key_limit_reached"
    assert f"holds {CAP} API keys, the most it may hold ({CAP})" in error["message"]
    assert "revoke keys it no longer uses" in error["message"]
    assert "api_key" not in refused.json()
    assert redis_client.hgetall(keys_key) == before
    assert len(client.get("/v1/keys", headers=acme).json()) == CAP
    # Revoking deletes the key's record, so its slot is free again.
    gone = made[0].json()
    assert client.delete(f"/v1/keys/{gone['key_id']}", headers=acme).status_code == 204
    assert client.get("/v1/keys", headers=bearer(gone["api_key"])).status_code == 401
    again = _create(client, acme)
    assert again.status_code == 201, again.text
    assert client.get("/v1/models", headers=bearer(again.json()["api_key"])).status_code != 401
    assert _create(client, acme).status_code == 409
    assert len(redis_client.hgetall(keys_key)) == CAP


def test_the_refused_key_never_authenticates(
    make_client: Callable[..., TestClient], redis_client: redis.Redis, namespace: str
) -> None:
    """Nothing of the refused key reaches Redis: no listing record and no lookup record
    (the only place a key is checked), and its audit entry and event are not written."""
    client = make_client(tenant_max_keys=1)
    acme = create_tenant(client, "acme")
    ns = RegistryKeys(namespace)
    lookups = set(redis_client.scan_iter(f"{namespace}:apikey:*"))
    events = redis_client.xlen(ns.events)
    assert _create(client, acme).status_code == 409
    assert set(redis_client.scan_iter(f"{namespace}:apikey:*")) == lookups
    assert redis_client.xlen(ns.events) == events
    audit = client.get("/v1/audit", headers=acme).json()
    assert audit["data"] and all(e["action"] != "key.create" for e in audit["data"]), audit


def test_the_operators_route_is_not_capped(make_client: Callable[..., TestClient]) -> None:
    client = make_client(tenant_max_keys=1)
    acme = create_tenant(client, "acme")
    made = client.post("/v1/tenants/acme/keys", headers=admin())
    assert made.status_code == 201, made.text
    assert _create(client, acme).status_code == 409


def test_concurrent_creations_do_not_pass_the_cap(
    make_client: Callable[..., TestClient],
    redis_client: redis.Redis,
    namespace: str,
) -> None:
    client = make_client(tenant_max_keys=CAP)
    create_tenant(client, "acme")
    writers = 12
    barrier = threading.Barrier(writers)
    outcomes: list[str] = []
    lock = threading.Lock()

    def create() -> None:
        service = TenantService(
            redis.Redis(connection_pool=redis_client.connection_pool), RegistryKeys(namespace), 100
        )
        barrier.wait()
        try:
            service.create_key("acme", KeySpec(), created_by="test", max_keys=CAP)
            outcome = "created"
        except Conflict as refused:
            outcome = refused.code
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=create) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == sorted(
        ["created"] * (CAP - 1) + ["key_limit_reached"] * (writers - CAP + 1)
    )
    assert redis_client.hlen(RegistryKeys(namespace).tenant_keys("acme")) == CAP
