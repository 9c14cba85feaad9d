"""A tenant's own API keys (POST/GET/DELETE /v1/keys) and the roles every tenant route
enforces: admin, developer, inference."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import time
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry import tenants as tenants_module
from preft_serve.registry.tenants import Principal, TenantService
from tests.support.ports import free_port
from tests.support.registry_api import admin, bearer, error_message, upload

ROLES = ("admin", "developer", "inference")
# (method, path, body, action in the refusal, least role): written out here, independent
# of the table in preft_serve.common.key_roles.
ROUTES: list[tuple[str, str, dict[str, Any] | None, str, str]] = [
    ("GET", "/v1/adapters", None, "read adapters", "developer"),
    ("DELETE", "/v1/adapters/nobody", None, "upload or change adapters", "developer"),
    ("GET", "/v1/users", None, "read user bindings", "developer"),
    ("PUT", "/v1/users/alice", {"adapter": "nobody"}, "change user bindings", "developer"),
    ("GET", "/v1/files", None, "read files", "developer"),
    ("GET", "/v1/fine_tuning/jobs", None, "read fine-tuning jobs", "developer"),
    ("GET", "/v1/usage", None, "read usage", "developer"),
    ("GET", "/v1/audit", None, "read the audit log", "admin"),
    ("GET", "/v1/keys", None, "read API keys", "admin"),
    ("POST", "/v1/keys", {"role": "inference"}, "create or revoke API keys", "admin"),
    ("DELETE", "/v1/keys/0123456789ab", None, "create or revoke API keys", "admin"),
]
ALLOWED = {
    "admin": {"admin"},
    "developer": {"admin", "developer"},
    "inference": {"admin", "developer", "inference"},
}


def _key(client: TestClient, headers: dict[str, str], role: str, **body: Any) -> dict[str, Any]:
    resp = client.post("/v1/keys", json={"role": role, **body}, headers=headers)
    assert resp.status_code == 201, resp.text
    created: dict[str, Any] = resp.json()
    return created


def _key_id(headers: dict[str, str]) -> str:
    return headers["Authorization"].split("pft_", 1)[1].split(".", 1)[0]


def _utc(stamp: str) -> dt.datetime:
    return dt.datetime.fromisoformat(stamp)


def test_a_new_key_is_shown_once_and_only_its_hash_is_stored(
    client: TestClient, acme: dict[str, str], redis_client: redis.Redis, namespace: str
) -> None:
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    key = _key(client, acme, "developer", name="ci deploy", ttl_s=3600)
    after = dt.datetime.now(dt.UTC)
    secret = key["api_key"]
    assert secret.startswith(f"pft_{key['key_id']}.")
    assert (key["tenant"], key["role"], key["name"]) == ("acme", "developer", "ci deploy")
    assert key["created_by"] == _key_id(acme)
    expires = _utc(key["expires_at"])
    assert before + dt.timedelta(hours=1) <= expires <= after + dt.timedelta(hours=1)
    dump = " ".join(
        f"{k} {redis_client.dump(k)!r}" for k in redis_client.scan_iter(f"{namespace}:*")
    )
    assert secret not in dump and secret.split(".", 1)[1] not in dump
    digest = hashlib.sha256(secret.encode()).hexdigest()
    lookup = redis_client.hgetall(RegistryKeys(namespace).api_key(digest))
    assert lookup == {
        "tenant": "acme",
        "key_id": key["key_id"],
        "role": "developer",
        "expires": lookup["expires"],
    }
    assert abs(float(lookup["expires"]) - expires.timestamp()) < 1
    listed = client.get("/v1/keys", headers=acme).json()
    assert [k["key_id"] for k in listed] == [_key_id(acme), key["key_id"]]
    assert all(set(k) == {*key} - {"tenant", "api_key"} for k in listed)
    assert "hash" not in json.dumps(listed) and digest not in json.dumps(listed)
    one = client.get(f"/v1/keys/{key['key_id']}", headers=acme).json()
    assert one == {k: v for k, v in key.items() if k not in ("tenant", "api_key")}
    assert listed[0]["role"] == "admin" and listed[0]["created_by"] == "operator"
    # The new key works, with its role.
    assert client.get("/v1/adapters", headers=bearer(secret)).status_code == 200


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("method", "path", "body", "action", "least"), ROUTES)
def test_each_role_against_each_route_family(
    client: TestClient,
    acme: dict[str, str],
    role: str,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    action: str,
    least: str,
) -> None:
    headers = bearer(_key(client, acme, role)["api_key"])
    resp = client.request(method, path, json=body, headers=headers)
    if role in ALLOWED[least]:
        assert resp.status_code != 403, resp.text
        assert resp.status_code < 500, resp.text
        return
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"]["code"] == "insufficient_role"
    roles = "developer or admin" if least == "developer" else "admin"
    assert error_message(resp) == (
        f"this key's role '{role}' cannot {action}; use a key with role {roles}"
    )


def test_an_inference_key_cannot_upload_and_nothing_is_stored(
    client: TestClient, acme: dict[str, str], lora_dir: Any, state_snapshot: Any
) -> None:
    headers = bearer(_key(client, acme, "inference")["api_key"])
    before = state_snapshot()
    resp = upload(client, headers, "bot", lora_dir)
    assert resp.status_code == 403
    assert error_message(resp) == (
        "this key's role 'inference' cannot upload or change adapters; "
        "use a key with role developer or admin"
    )
    assert state_snapshot() == before
    developer = bearer(_key(client, acme, "developer")["api_key"])
    assert upload(client, developer, "bot", lora_dir).status_code == 201


def _in(seconds: float) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)).isoformat()


BAD = [
    ({"role": "owner"}, "role", "role 'owner' is unknown: use one of admin, developer, inference"),
    (
        {"role": "developer", "name": "x" * 65},
        "name",
        "key name 'xxxxxxxx",
    ),
    (
        {"role": "developer", "name": "bad\nname"},
        "name",
        "key name 'bad\\nname' is invalid: use 1-64 letters, digits, spaces or '.', '_', "
        "'@', '-', starting with a letter or digit",
    ),
    (
        {"role": "developer", "expires_at": "2020-01-01T00:00:00Z"},
        "expires_at",
        "expires_at '2020-01-01T00:00:00Z' is not in the future: give a time at least 60 "
        "seconds from now",
    ),
    (
        {"role": "developer", "expires_at": "2030-01-01T00:00:00"},
        "expires_at",
        "expires_at '2030-01-01T00:00:00' is not an RFC 3339 time with an offset: write it "
        "like 2027-01-31T12:00:00Z",
    ),
    (
        {"role": "developer", "expires_at": "next tuesday"},
        "expires_at",
        "expires_at 'next tuesday' is not an RFC 3339 time with an offset",
    ),
    (
        {"role": "developer", "expires_at": "9999-01-01T00:00:00Z"},
        "expires_at",
        "expires_at '9999-01-01T00:00:00Z' is too far ahead: keys last at most 1825 days",
    ),
    (
        {"role": "developer", "ttl_s": 59},
        "ttl_s",
        "ttl_s 59 is out of bounds: use 60 to 157680000 seconds (1825 days)",
    ),
    (
        {"role": "developer", "ttl_s": 157680001},
        "ttl_s",
        "ttl_s 157680001 is out of bounds: use 60 to 157680000 seconds (1825 days)",
    ),
    (
        {"role": "developer", "ttl_s": 3600, "expires_at": "2030-01-01T00:00:00Z"},
        "expires_at",
        "give expires_at or ttl_s, not both",
    ),
]


@pytest.mark.parametrize(("body", "param", "message"), BAD)
def test_bad_key_requests_are_refused_with_what_to_fix_and_nothing_stored(
    client: TestClient,
    acme: dict[str, str],
    state_snapshot: Any,
    body: dict[str, Any],
    param: str,
    message: str,
) -> None:
    before = state_snapshot()
    for path, headers in (("/v1/keys", acme), ("/v1/tenants/acme/keys", admin())):
        resp = client.post(path, json=body, headers=headers)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == param
        assert error_message(resp).startswith(message)
    assert state_snapshot() == before


def test_a_name_too_long_is_cut_in_the_message(client: TestClient, acme: dict[str, str]) -> None:
    resp = client.post("/v1/keys", json={"role": "admin", "name": "n" * 10_000}, headers=acme)
    assert resp.status_code == 400
    assert len(error_message(resp)) < 400 and "(10000 characters)" in error_message(resp)


def test_missing_role_and_unknown_fields_are_422(
    client: TestClient, acme: dict[str, str], state_snapshot: Any
) -> None:
    before = state_snapshot()
    resp = client.post("/v1/keys", json={}, headers=acme)
    assert resp.status_code == 422
    assert error_message(resp) == "invalid request: role: field required"
    resp = client.post("/v1/keys", json={"role": "admin", "scope": "all"}, headers=acme)
    assert resp.status_code == 422
    assert "scope" in error_message(resp)
    assert state_snapshot() == before


def test_an_expired_key_is_refused(
    client: TestClient, acme: dict[str, str], redis_client: redis.Redis, namespace: str
) -> None:
    key = _key(client, acme, "developer", ttl_s=60)
    headers = bearer(key["api_key"])
    assert client.get("/v1/adapters", headers=headers).status_code == 200
    # A minute later: the lookup record's expiry has passed (Redis keeps the record a
    # day longer, so the caller is told why).
    lookup = RegistryKeys(namespace).api_key(hashlib.sha256(key["api_key"].encode()).hexdigest())
    past = time.time() - 1
    redis_client.hset(lookup, "expires", f"{past:.3f}")
    assert redis_client.ttl(lookup) > 86400
    resp = client.get("/v1/adapters", headers=headers)
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "expired_api_key"
    when = dt.datetime.fromtimestamp(float(f"{past:.3f}"), dt.UTC).isoformat(timespec="seconds")
    assert error_message(resp) == (
        f"API key {key['key_id']} expired at {when}; use another key, or ask an admin "
        "of your tenant for a new one"
    )


def test_last_used_is_written_once_a_minute_after_a_request_succeeds(
    client: TestClient,
    acme: dict[str, str],
    state_snapshot: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = _key(client, acme, "developer")
    headers = bearer(key["api_key"])
    assert key["last_used_at"] is None
    before = state_snapshot()
    resp = client.get("/v1/adapters/nobody", headers=headers)
    assert resp.status_code == 404
    assert state_snapshot() == before  # a refused request records nothing

    def last_used() -> str | None:
        found = client.get(f"/v1/keys/{key['key_id']}", headers=acme).json()["last_used_at"]
        return str(found) if found else None

    start = dt.datetime.now(dt.UTC)
    assert client.get("/v1/adapters", headers=headers).status_code == 200
    first = last_used()
    assert first is not None and start - dt.timedelta(seconds=1) <= _utc(first)
    assert client.get("/v1/adapters", headers=headers).status_code == 200
    assert last_used() == first  # within the minute: not written again
    monkeypatch.setattr(tenants_module, "KEY_USE_INTERVAL_S", 0.0)  # as if a minute passed
    time.sleep(0.01)
    assert client.get("/v1/adapters", headers=headers).status_code == 200
    moved = last_used()
    assert moved is not None and _utc(moved) > _utc(first)


def test_a_redis_error_writing_last_use_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5, decode_responses=True)
    service = TenantService(dead, RegistryKeys("x"), 100)
    with caplog.at_level(logging.WARNING, logger=tenants_module.__name__):
        service.record_use(Principal("acme", "0123456789ab"))
    assert "could not record the use of key 0123456789ab" in caplog.text


def test_the_last_admin_key_cannot_be_revoked_by_its_tenant(
    client: TestClient, acme: dict[str, str], state_snapshot: Any
) -> None:
    own = _key_id(acme)
    _key(client, acme, "developer")
    before = state_snapshot()
    resp = client.delete(f"/v1/keys/{own}", headers=acme)
    assert resp.status_code == 409
    assert error_message(resp) == (
        f"key '{own}' is tenant 'acme''s last admin key: create another admin key first "
        "(POST /v1/keys with role admin), then revoke this one"
    )
    assert state_snapshot() == before
    second = _key(client, acme, "admin")
    assert client.delete(f"/v1/keys/{own}", headers=acme).status_code == 204
    resp = client.get("/v1/keys", headers=acme)
    assert resp.status_code == 401 and error_message(resp) == "invalid or revoked API key"
    new_admin = bearer(second["api_key"])
    assert own not in [k["key_id"] for k in client.get("/v1/keys", headers=new_admin).json()]
    # The operator can still revoke the last one.
    resp = client.delete(f"/v1/tenants/acme/keys/{second['key_id']}", headers=admin())
    assert resp.status_code == 204


def test_one_tenant_cannot_see_or_revoke_anothers_keys(
    client: TestClient, acme: dict[str, str], new_tenant: Any, state_snapshot: Any
) -> None:
    globex = new_tenant("globex")
    acme_dev = _key(client, acme, "developer")
    listed = client.get("/v1/keys", headers=globex).json()
    assert [k["key_id"] for k in listed] == [_key_id(globex)]
    before = state_snapshot()
    for method in ("GET", "DELETE"):
        resp = client.request(method, f"/v1/keys/{acme_dev['key_id']}", headers=globex)
        assert resp.status_code == 404
        assert error_message(resp) == f"tenant 'globex' has no key '{acme_dev['key_id']}'"
    assert state_snapshot() == before
    assert client.get("/v1/adapters", headers=bearer(acme_dev["api_key"])).status_code == 200


def test_key_create_and_revoke_are_audited_without_secrets(
    client: TestClient, acme: dict[str, str], redis_client: redis.Redis, namespace: str
) -> None:
    caller = _key_id(acme)
    key = _key(client, acme, "inference", name="chat app", ttl_s=600)
    assert client.delete(f"/v1/keys/{key['key_id']}", headers=acme).status_code == 204
    entries = client.get("/v1/audit", headers=acme, params={"limit": 100}).json()["data"]
    mine = [
        (e["actor"], e["action"], e["target"], e["before"], e["after"])
        for e in entries
        if e["action"] in ("key.create", "key.revoke") and e["actor"] != "operator"
    ]
    described = json.dumps(
        {"role": "inference", "name": "chat app", "expires_at": key["expires_at"]}
    )
    assert mine == [
        (caller, "key.create", key["key_id"], None, described),
        (caller, "key.revoke", key["key_id"], described, None),
    ]
    stream = json.dumps(redis_client.xrange(RegistryKeys(namespace).audit("acme")))
    assert key["api_key"].split(".", 1)[1] not in stream


def test_the_operator_can_issue_keys_with_a_role(client: TestClient, acme: dict[str, str]) -> None:
    resp = client.post(
        "/v1/tenants/acme/keys", json={"role": "inference", "name": "demo"}, headers=admin()
    )
    assert resp.status_code == 201, resp.text
    key = resp.json()
    assert (key["role"], key["name"], key["created_by"]) == ("inference", "demo", "operator")
    resp = client.get("/v1/adapters", headers=bearer(key["api_key"]))
    assert resp.status_code == 403
    plain = client.post("/v1/tenants/acme/keys", headers=admin()).json()
    assert plain["role"] == "admin" and plain["expires_at"] is None


def test_key_routes_are_in_the_openapi_document(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path, methods in (("/v1/keys", {"get", "post"}), ("/v1/keys/{key_id}", {"get", "delete"})):
        assert set(spec["paths"][path]) == methods
        for op in spec["paths"][path].values():
            assert op["security"] == [{"TenantApiKey": []}]
            assert "403" in op["responses"]
    body = spec["components"]["schemas"]["ApiKeyCreate"]["properties"]
    assert body["role"]["enum"] == list(ROLES)
    assert "409" in spec["paths"]["/v1/keys/{key_id}"]["delete"]["responses"]
