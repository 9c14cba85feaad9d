"""Admin-created tenants, API keys shown once and stored hashed, rotation and revocation."""

from __future__ import annotations

import hashlib

from preft_serve.common.registry_client import RegistryKeys
from tests.support.registry_api import admin, bearer, error_message


def test_create_tenant_returns_key_once_and_stores_only_its_hash(client, redis_client, namespace):
    resp = client.post("/v1/tenants", json={"name": "acme"}, headers=admin())
    assert resp.status_code == 201
    body = resp.json()
    key = body["api_key"]
    assert key.startswith(f"pft_{body['key_id']}.")
    dump = " ".join(
        f"{k} {redis_client.dump(k)!r}" for k in redis_client.scan_iter(f"{namespace}:*")
    )
    assert key not in dump and key.split(".", 1)[1] not in dump
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert redis_client.hgetall(RegistryKeys(namespace).api_key(digest)) == {
        "tenant": "acme",
        "key_id": body["key_id"],
    }
    shown = client.get("/v1/tenants/acme", headers=admin()).json()
    assert shown["name"] == "acme"
    assert [k["key_id"] for k in shown["keys"]] == [body["key_id"]]
    assert "api_key" not in shown
    assert client.get("/v1/adapters", headers=bearer(key)).status_code == 200


def test_admin_auth_required(client, state_snapshot):
    before = state_snapshot()
    resp = client.post("/v1/tenants", json={"name": "acme"})
    assert resp.status_code == 401
    assert error_message(resp) == "missing credentials: send 'Authorization: Bearer <admin token>'"
    resp = client.post(
        "/v1/tenants",
        json={"name": "acme"},
        headers={"Authorization": "Bearer wrong-token-wrong-token"},
    )
    assert resp.status_code == 401
    assert error_message(resp) == "invalid admin token"
    resp = client.post(
        "/v1/tenants", json={"name": "acme"}, headers={"Authorization": "Basic dXNlcjpwYXNz"}
    )
    assert resp.status_code == 401
    assert state_snapshot() == before


def test_tenant_key_is_not_an_admin_token_and_vice_versa(client, acme):
    resp = client.post("/v1/tenants", json={"name": "evil"}, headers=acme)
    assert resp.status_code == 401
    assert error_message(resp) == "invalid admin token"
    resp = client.get("/v1/adapters", headers=admin())
    assert resp.status_code == 401
    assert error_message(resp).startswith("not a preft API key (they start with 'pft_')")


def test_duplicate_and_invalid_tenant_names(client, acme, state_snapshot):
    before = state_snapshot()
    resp = client.post("/v1/tenants", json={"name": "acme"}, headers=admin())
    assert resp.status_code == 409
    assert error_message(resp) == (
        "tenant 'acme' already exists; choose another name or issue "
        "a new key with POST /v1/tenants/acme/keys"
    )
    resp = client.post("/v1/tenants", json={"name": "Bad Name"}, headers=admin())
    assert resp.status_code == 400
    assert error_message(resp) == (
        "tenant name 'Bad Name' is invalid: use 2-63 lowercase "
        "letters, digits or '-', starting with a letter or digit"
    )
    resp = client.post("/v1/tenants", json={}, headers=admin())
    assert resp.status_code == 422
    assert error_message(resp) == "invalid request: name: field required"
    assert state_snapshot() == before


def test_rotate_then_revoke(client):
    first = client.post("/v1/tenants", json={"name": "acme"}, headers=admin()).json()
    second = client.post("/v1/tenants/acme/keys", headers=admin())
    assert second.status_code == 201
    second = second.json()
    for key in (first["api_key"], second["api_key"]):  # both live during rotation
        assert client.get("/v1/adapters", headers=bearer(key)).status_code == 200
    keys = client.get("/v1/tenants/acme/keys", headers=admin()).json()
    assert {k["key_id"] for k in keys} == {first["key_id"], second["key_id"]}
    resp = client.delete(f"/v1/tenants/acme/keys/{first['key_id']}", headers=admin())
    assert resp.status_code == 204
    resp = client.get("/v1/adapters", headers=bearer(first["api_key"]))
    assert resp.status_code == 401
    assert error_message(resp) == "invalid or revoked API key"
    assert client.get("/v1/adapters", headers=bearer(second["api_key"])).status_code == 200
    resp = client.delete(f"/v1/tenants/acme/keys/{first['key_id']}", headers=admin())
    assert resp.status_code == 404
    assert error_message(resp) == f"tenant 'acme' has no key '{first['key_id']}'"


def test_unknown_tenant(client):
    for resp in (
        client.get("/v1/tenants/ghost", headers=admin()),
        client.post("/v1/tenants/ghost/keys", headers=admin()),
        client.get("/v1/tenants/ghost/keys", headers=admin()),
    ):
        assert resp.status_code == 404
        assert error_message(resp) == "tenant 'ghost' does not exist"


def test_rate_limit_overrides_round_trip_and_bad_values_change_nothing(
    client, acme, state_snapshot
):
    assert client.get("/v1/tenants/acme/limits", headers=admin()).json() == {
        "tenant_rps": None,
        "tenant_burst": None,
        "user_rps": None,
        "user_burst": None,
        "tenant_tpm": None,
        "user_tpm": None,
    }
    resp = client.put(
        "/v1/tenants/acme/limits",
        json={"tenant_rps": 50, "user_rps": 2.5, "user_tpm": 6000},
        headers=admin(),
    )
    assert resp.status_code == 200, resp.text
    assert client.get("/v1/tenants/acme/limits", headers=admin()).json() == {
        "tenant_rps": 50.0,
        "tenant_burst": None,
        "user_rps": 2.5,
        "user_burst": None,
        "tenant_tpm": None,
        "user_tpm": 6000.0,
    }
    before = state_snapshot()
    for body, needle in (
        ({"tenant_rps": -1}, "greater than or equal to 0"),
        ({"user_burst": 1.5}, "valid integer"),
        ({"tenant_tpm": -5}, "greater than or equal to 0"),
        ({"tenant_qps": 5}, "Extra inputs are not permitted"),
    ):
        bad = client.put("/v1/tenants/acme/limits", json=body, headers=admin())
        assert bad.status_code == 422, bad.text
        assert needle in str(bad.json()["error"])
    assert client.put("/v1/tenants/acme/limits", json={}, headers=acme).status_code == 401
    ghost = client.put("/v1/tenants/ghost/limits", json={"tenant_rps": 1}, headers=admin())
    assert ghost.status_code == 404 and error_message(ghost) == "tenant 'ghost' does not exist"
    assert state_snapshot() == before
    cleared = client.put("/v1/tenants/acme/limits", json={}, headers=admin())
    assert cleared.status_code == 200
    assert client.get("/v1/tenants/acme/limits", headers=admin()).json()["tenant_rps"] is None


def test_rate_limit_overrides_refuse_booleans_and_numeric_strings(client, acme, state_snapshot):
    """``{"tenant_burst": true}`` was stored as a burst of 1 and ``"5"`` as 5 (pydantic's lax
    mode); the document says number/integer. Found by the API fuzzer (tests/fuzz,
    schemathesis ST201: a schema-violating request accepted)."""
    assert (
        client.put(
            "/v1/tenants/acme/limits", json={"tenant_burst": 3, "user_rps": 2}, headers=admin()
        ).status_code
        == 200
    )
    before = state_snapshot()
    for body in (
        {"tenant_burst": True},
        {"user_tpm": True},
        {"tenant_rps": False},
        {"tenant_rps": "5"},
        {"user_burst": "3"},
        {"user_burst": 2.5},
    ):
        bad = client.put("/v1/tenants/acme/limits", json=body, headers=admin())
        assert bad.status_code == 422, (body, bad.text)
        assert bad.json()["error"]["code"] == "invalid_value"
        assert "Input should be a valid" in error_message(bad)
    assert state_snapshot() == before
    # What is stored (strings in Redis) still reads back as numbers.
    assert client.get("/v1/tenants/acme/limits", headers=admin()).json() == {
        "tenant_rps": None,
        "tenant_burst": 3,
        "user_rps": 2.0,
        "user_burst": None,
        "tenant_tpm": None,
        "user_tpm": None,
    }


def test_integral_float_burst_is_an_integer(client, acme):
    """JSON Schema (and JSON) count 2.0 as the integer 2; the fuzzer sent
    ``{"user_burst": 79944.0}`` as a valid case and got 422."""
    ok = client.put("/v1/tenants/acme/limits", json={"user_burst": 79944.0}, headers=admin())
    assert ok.status_code == 200, ok.text
    assert client.get("/v1/tenants/acme/limits", headers=admin()).json()["user_burst"] == 79944


def test_unbound_user_setting_is_a_merge_patch_with_a_documented_default(
    client, acme, redis_client, namespace
):
    """What a user without a binding gets when naming the base model: base_model by
    default; the tenant record holds the choice the gateway reads."""
    assert client.get("/v1/tenants/acme", headers=admin()).json()["unbound_user"] == "base_model"
    resp = client.patch("/v1/tenants/acme", json={"unbound_user": "not_found"}, headers=admin())
    assert resp.status_code == 200, resp.text
    assert resp.json()["unbound_user"] == "not_found"
    record = RegistryKeys(namespace).tenant("acme")
    assert redis_client.hget(record, "unbound_user") == "not_found"
    # A patch of the quota alone leaves it; null goes back to the default.
    quota = client.patch(
        "/v1/tenants/acme", json={"quota": {"max_adapters": 5}}, headers=admin()
    ).json()
    assert quota["unbound_user"] == "not_found" and quota["quota"]["max_adapters"] == 5
    reset = client.patch("/v1/tenants/acme", json={"unbound_user": None}, headers=admin())
    assert reset.json()["unbound_user"] == "base_model"
    assert redis_client.hget(record, "unbound_user") is None
    assert reset.json()["quota"]["max_adapters"] == 5
    bad = client.patch("/v1/tenants/acme", json={"unbound_user": "error"}, headers=admin())
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "unbound_user"
    assert (
        client.patch(
            "/v1/tenants/acme", json={"unbound_user": "not_found"}, headers=acme
        ).status_code
        == 401
    )


def test_tenants_are_listed_a_page_at_a_time_through_next_links(client, state_snapshot):
    names = sorted(f"page-{i:02d}" for i in range(7))
    for name in reversed(names):
        assert client.post("/v1/tenants", json={"name": name}, headers=admin()).status_code == 201
    whole = client.get("/v1/tenants", headers=admin())
    assert [t["name"] for t in whole.json()] == names and "link" not in whole.headers
    seen, url, pages = [], "/v1/tenants?limit=3", 0
    while url:
        page = client.get(url, headers=admin())
        assert page.status_code == 200, page.text
        assert len(page.json()) <= 3
        seen += [t["name"] for t in page.json()]
        url = page.links.get("next", {}).get("url")
        pages += 1
    assert seen == names and pages == 3
    after = client.get("/v1/tenants", params={"after": "page-05"}, headers=admin()).json()
    assert [t["name"] for t in after] == ["page-06"]
    assert client.get("/v1/tenants", params={"after": "zzz"}, headers=admin()).json() == []
    before = state_snapshot()
    for params, says in (
        ({"limit": 0}, "greater than or equal to 1"),
        ({"limit": 1001}, "less than or equal to 1000"),
        ({"after": "x" * 65}, "at most 64 characters"),
    ):
        refused = client.get("/v1/tenants", params=params, headers=admin())
        assert refused.status_code == 422 and says in refused.text, refused.text
    assert state_snapshot() == before
