"""DELETE /v1/tenants/{tenant}: keys, bindings, adapters and unshared blobs go; nothing of
any other tenant changes (a blob another tenant uploaded too survives)."""

from __future__ import annotations

from preft_serve.common.registry_client import RegistryKeys
from tests.support.registry_api import admin, upload


def test_delete_removes_everything_of_the_tenant_only(
    client, new_tenant, lora_dir, lora_dir2, redis_client, namespace, state_snapshot
):
    keys = RegistryKeys(namespace)
    acme, globex = new_tenant("acme"), new_tenant("globex")
    shared = upload(client, acme, "bot", lora_dir).json()["sha256"]
    solo = upload(client, acme, "solo", lora_dir2).json()["sha256"]
    assert upload(client, globex, "same", lora_dir).json()["sha256"] == shared
    assert client.put("/v1/users/alice", json={"adapter": "bot"}, headers=acme).status_code == 200
    assert (
        client.put("/v1/users/alice", json={"adapter": "same"}, headers=globex).status_code == 200
    )
    assert (
        client.put("/v1/tenants/acme/limits", json={"tenant_rps": 5}, headers=admin()).status_code
        == 200
    )
    for bucket in (
        "ratelimit:user:acme:alice",
        "ratelimit:tenant:acme",
        "ratelimit:tenant:globex",
        "ratelimit:user:globex:acme",
    ):
        redis_client.hset(f"{namespace}:{bucket}", mapping={"t": 1, "ts": 1})
    acme_api_keys = {
        k
        for k in redis_client.scan_iter(f"{namespace}:apikey:*")
        if redis_client.hget(k, "tenant") == "acme"
    }
    before = state_snapshot()

    resp = client.delete("/v1/tenants/acme", headers=admin())

    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "name": "acme",
        "keys": 1,
        "adapters": 2,
        "bindings": 1,
        "blobs": 1,
        "files": 0,
        "fine_tuning_jobs": 0,
    }
    after = state_snapshot()
    gone = {k for k in before["redis"] if k.startswith(f"{keys.tenant('acme')}")}
    gone |= acme_api_keys | {
        keys.blob(solo),
        f"{namespace}:ratelimit:user:acme:alice",
        f"{namespace}:ratelimit:tenant:acme",
    }
    # The audit log records the deletion (and restarts the tenant's own stream with it).
    changed = {
        keys.tenants,
        keys.events,
        f"{namespace}:audit:all",
        f"{namespace}:audit:tenant:acme",
    }
    # New: the deleted content's epoch token (blob_gc), kept a day for uploads racing it.
    epoch = keys.blob_epoch(solo)
    assert set(after["redis"]) == (set(before["redis"]) - gone) | {epoch}
    assert redis_client.ttl(epoch) > 0
    changed.add(epoch)
    assert {k: v for k, v in after["redis"].items() if k not in changed} == {
        k: v for k, v in before["redis"].items() if k not in gone | changed
    }
    assert redis_client.smembers(keys.tenants) == {"globex"}
    assert after["bucket"] == [o for o in before["bucket"] if f"/{solo}/" not in o[0]]
    assert any(f"/{shared}/" in o[0] for o in after["bucket"])
    events = [f for _, f in redis_client.xrange(keys.events)][-4:]
    assert [(e["type"], e.get("adapter"), e.get("user")) for e in events] == [
        ("apikey.revoked", None, None),
        ("binding.deleted", "bot", "alice"),
        ("adapter.deleted", "bot", None),
        ("adapter.deleted", "solo", None),
    ]
    # The tenant is gone for every caller; the other tenant still works.
    assert client.get("/v1/adapters", headers=acme).status_code == 401
    assert client.get("/v1/tenants/acme", headers=admin()).status_code == 404
    assert client.delete("/v1/tenants/acme", headers=admin()).status_code == 404
    assert client.get("/v1/users/alice", headers=globex).json()["sha256"] == shared
    listed = client.get("/v1/tenants", headers=admin()).json()
    assert [(t["name"], t["adapters"]) for t in listed] == [("globex", 1)]


def test_delete_needs_admin_and_a_valid_name(client, acme):
    assert client.delete("/v1/tenants/acme", headers=acme).status_code == 401
    assert client.get("/v1/tenants", headers=acme).status_code == 401
    resp = client.delete("/v1/tenants/Bad_Name", headers=admin())
    assert resp.status_code == 400 and "tenant name 'Bad_Name' is invalid" in resp.text
