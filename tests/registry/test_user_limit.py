"""A tenant binds at most ``TENANT_MAX_USERS`` users: each binding is kept in Redis, which
refuses every tenant's writes once full, so a tenant binding new user ids in a loop meets
its own limit first. Rebinding a bound user is not a new one; unbinding, or deleting an
adapter with its users, makes room again; other tenants are not affected."""

from __future__ import annotations

from preft_serve.common.registry_client import RegistryKeys
from tests.support.registry_api import admin, create_tenant, upload


def _bind(client, headers, user: str, adapter: str):  # type: ignore[no-untyped-def]
    return client.put(f"/v1/users/{user}", json={"adapter": adapter}, headers=headers)


def test_a_tenant_binds_at_most_its_limit_of_new_users(
    make_client, state_snapshot, lora_dir, lora_dir2, redis_client, namespace
) -> None:
    client = make_client(tenant_max_users=2)
    acme, beta = create_tenant(client, "acme"), create_tenant(client, "beta")
    for name, folder in (("a", lora_dir), ("b", lora_dir2)):
        assert upload(client, acme, name, folder).status_code == 201
    assert upload(client, beta, "a", lora_dir).status_code == 201
    count = RegistryKeys(namespace).bound_users("acme")
    assert [_bind(client, acme, u, "a").status_code for u in ("u1", "u2")] == [200, 200]

    before = state_snapshot()
    refused = _bind(client, acme, "u3", "a")
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("quota_exceeded", "user_id")
    assert (
        "already has 2 bound users, its limit (PREFT_REGISTRY_TENANT_MAX_USERS)"
        in (error["message"])
    )
    assert state_snapshot() == before
    assert _bind(client, acme, "u1", "b").status_code == 200  # a rebinding is no new user
    assert redis_client.get(count) == "2"
    assert [_bind(client, beta, u, "a").status_code for u in ("u1", "u2")] == [200, 200]

    assert client.delete("/v1/users/u2", headers=acme).status_code == 204
    assert _bind(client, acme, "u3", "a").status_code == 200
    # deleting an adapter with its users gives their room back
    assert client.delete("/v1/adapters/a?force=true", headers=acme).status_code == 204
    assert redis_client.get(count) == "1"  # u1, on b
    assert [_bind(client, acme, u, "b").status_code for u in ("u4", "u5")] == [200, 403]


def test_concurrent_unbinds_count_every_user(
    client, acme, lora_dir, redis_client, namespace
) -> None:
    """Unbinds of different users at once each lower the count (the count is watched):
    none is lost, so a tenant cleaning up in parallel gets all its room back."""
    from concurrent.futures import ThreadPoolExecutor

    count = RegistryKeys(namespace).bound_users("acme")
    assert upload(client, acme, "a", lora_dir).status_code == 201
    users = [f"u{i}" for i in range(24)]
    bindings = client.app.state.registry.bindings
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda u: bindings.bind("acme", u, "a"), users))
        assert redis_client.get(count) == str(len(users))
        list(pool.map(lambda u: bindings.unbind("acme", u), users))
    assert redis_client.get(count) == "0"


def test_bindings_made_before_the_count_never_take_it_below_zero(
    client, acme, lora_dir, redis_client, namespace
) -> None:
    count = RegistryKeys(namespace).bound_users("acme")
    assert upload(client, acme, "a", lora_dir).status_code == 201
    for user in ("old1", "old2", "new"):
        assert _bind(client, acme, user, "a").status_code == 200
    redis_client.set(count, 1)  # as if old1 and old2 were bound before the count existed
    assert client.delete("/v1/users/old1", headers=acme).status_code == 204
    assert client.delete("/v1/users/old2", headers=acme).status_code == 204
    assert redis_client.get(count) == "0"
    assert client.delete("/v1/users/new", headers=acme).status_code == 204
    assert redis_client.get(count) == "0"
    # the tenant's delete removes the count with everything else it owns
    assert _bind(client, acme, "again", "a").status_code == 200
    assert redis_client.get(count) == "1"
    assert client.delete("/v1/tenants/acme?force=true", headers=admin()).status_code == 200
    assert redis_client.get(count) is None
