"""Names from paths, bodies and queries are validated on every route before they become
part of a Redis key, so no name can address another key (``k-bot:users`` was k-bot's
bound-user set). Each refusal is a 400 saying what a valid name is, quotes at most 100
characters of the name, and changes nothing in Redis or the bucket."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from preft_serve.common.text import shown
from tests.support.registry_api import admin, error_message, upload

ADAPTER_RULE = "is invalid: use 1-64 letters, digits, '.', '_' or '-'"
USER_RULE = "is invalid: use 1-128 letters, digits or '.', '_', '@', '+', '=', '-'"
TENANT_RULE = "is invalid: use 2-63 lowercase letters, digits or '-'"
# Names that would address k-bot's internal keys, or that only a `$` (which also matches
# before a final newline) let through.
FORGED_ADAPTERS = ["k-bot:users", "k-bot:versions", "k-bot\n"]


@pytest.fixture
def k_bot(client, acme, lora_dir):
    """acme's adapter k-bot with two versions and a bound user."""
    assert upload(client, acme, "k-bot", lora_dir).status_code == 201
    assert upload(client, acme, "k-bot", lora_dir, mode="all", method="PUT").status_code == 201
    assert client.put("/v1/users/u1", json={"adapter": "k-bot"}, headers=acme).status_code == 200
    return acme


def _path(name: str) -> str:
    return quote(name, safe="")


@pytest.mark.parametrize("name", FORGED_ADAPTERS)
@pytest.mark.parametrize("route", ["get", "delete", "delete force", "put", "bind", "cursor"])
def test_adapter_routes_refuse_names_that_forge_keys(
    route, name, client, k_bot, lora_dir, state_snapshot
):
    before = state_snapshot()
    path = f"/v1/adapters/{_path(name)}"
    if route == "get":
        resp = client.get(path, headers=k_bot)
    elif route == "delete":
        resp = client.delete(path, headers=k_bot)
    elif route == "delete force":
        resp = client.delete(path, params={"force": True}, headers=k_bot)
    elif route == "put":
        resp = upload(client, k_bot, _path(name), lora_dir, method="PUT")
    elif route == "bind":
        resp = client.put("/v1/users/u2", json={"adapter": name}, headers=k_bot)
    else:
        resp = client.get("/v1/adapters", params={"cursor": name}, headers=k_bot)
    assert resp.status_code == 400, resp.text
    what = "cursor" if route == "cursor" else "adapter name"
    assert error_message(resp).startswith(f"{what} {name!r} is invalid")
    assert state_snapshot() == before
    # k-bot itself is intact: history and bound user.
    detail = client.get("/v1/adapters/k-bot", headers=k_bot).json()
    assert [v["version"] for v in detail["versions"]] == [1, 2]
    assert detail["bound_users"] == 1


@pytest.mark.parametrize("user", ["u1\n", "u1:x", "a" * 129])
@pytest.mark.parametrize("method", ["put", "get", "delete"])
def test_user_routes_refuse_invalid_ids(method, user, client, k_bot, state_snapshot):
    before = state_snapshot()
    path = f"/v1/users/{_path(user)}"
    if method == "put":
        resp = client.put(path, json={"adapter": "k-bot"}, headers=k_bot)
    else:
        resp = getattr(client, method)(path, headers=k_bot)
    assert resp.status_code == 400, resp.text
    assert error_message(resp).startswith(f"user id {shown(user)} {USER_RULE}")
    assert state_snapshot() == before


FORGED_TENANTS = ["acme:adapter:k-bot", "acme:keys", "acme\n"]


@pytest.mark.parametrize("tenant", FORGED_TENANTS)
@pytest.mark.parametrize(
    "route", ["get", "list keys", "create key", "revoke key", "get limits", "put limits", "create"]
)
def test_tenant_routes_refuse_names_that_forge_keys(route, tenant, client, k_bot, state_snapshot):
    before = state_snapshot()
    path = f"/v1/tenants/{_path(tenant)}"
    resp = {
        "get": lambda: client.get(path, headers=admin()),
        "list keys": lambda: client.get(f"{path}/keys", headers=admin()),
        "create key": lambda: client.post(f"{path}/keys", headers=admin()),
        "revoke key": lambda: client.delete(f"{path}/keys/0123456789ab", headers=admin()),
        "get limits": lambda: client.get(f"{path}/limits", headers=admin()),
        "put limits": lambda: client.put(f"{path}/limits", json={"tenant_rps": 1}, headers=admin()),
        "create": lambda: client.post("/v1/tenants", json={"name": tenant}, headers=admin()),
    }[route]()
    assert resp.status_code == 400, resp.text
    assert error_message(resp).startswith(f"tenant name {tenant!r} {TENANT_RULE}")
    assert state_snapshot() == before


def test_revoke_refuses_a_malformed_key_id(client, acme, state_snapshot):
    before = state_snapshot()
    resp = client.delete("/v1/tenants/acme/keys/" + _path("x:y" * 2000), headers=admin())
    assert resp.status_code == 400
    message = error_message(resp)
    assert message.startswith("key id 'x:yx:y")
    assert "is invalid: key ids are 12 lowercase hex characters" in message
    assert len(message) < 400
    assert state_snapshot() == before


@pytest.mark.parametrize("path", ["/v1/adapters/{}", "/v1/users/{}", "/v1/tenants/{}"])
def test_long_names_are_cut_in_messages(path, client, acme, state_snapshot):
    name = "a" * 200 + ":" + "b" * 20_000
    before = state_snapshot()
    resp = client.get(path.format(_path(name)), headers=admin() if "tenants" in path else acme)
    assert resp.status_code == 400
    message = error_message(resp)
    assert f"{'a' * 100}…' (20201 characters) is invalid" in message
    assert len(resp.content) < 600
    assert state_snapshot() == before
