"""User bindings: bind, rebind, show, unbind, and the hot swap moving bound users."""

from __future__ import annotations

from tests.support.registry_api import error_message, upload


def test_bind_show_rebind_unbind(client, acme, lora_dir, lora_dir2, state_snapshot):
    a = upload(client, acme, "a", lora_dir).json()
    b = upload(client, acme, "b", lora_dir2, mode="all").json()
    resp = client.put("/v1/users/alice@example.com", json={"adapter": "a"}, headers=acme)
    assert resp.status_code == 200
    assert resp.json() == {
        "user": "alice@example.com",
        "adapter": "a",
        "version": 1,
        "sha256": a["sha256"],
        "type": "lora",
        "mode": "prefill",
        "variant": "serving",
    }
    before = state_snapshot()
    same = client.put("/v1/users/alice@example.com", json={"adapter": "a"}, headers=acme)
    assert same.status_code == 200 and state_snapshot() == before  # no-op, no event
    resp = client.put("/v1/users/alice@example.com", json={"adapter": "b"}, headers=acme)
    assert resp.json()["sha256"] == b["sha256"] and resp.json()["mode"] == "all"
    assert client.get("/v1/adapters/a", headers=acme).json()["bound_users"] == 0
    assert client.get("/v1/adapters/b", headers=acme).json()["bound_users"] == 1
    assert client.get("/v1/users/alice@example.com", headers=acme).json()["adapter"] == "b"
    assert client.delete("/v1/users/alice@example.com", headers=acme).status_code == 204
    resp = client.delete("/v1/users/alice@example.com", headers=acme)
    assert resp.status_code == 404
    assert error_message(resp) == "user 'alice@example.com' is not bound to an adapter"
    assert client.get("/v1/adapters/b", headers=acme).json()["bound_users"] == 0


def test_hot_swap_moves_bound_users(client, acme, lora_dir, lora_dir2):
    upload(client, acme, "bot", lora_dir)
    client.put("/v1/users/u1", json={"adapter": "bot"}, headers=acme)
    v2 = upload(client, acme, "bot", lora_dir2, method="PUT").json()
    bound = client.get("/v1/users/u1", headers=acme).json()
    assert (bound["version"], bound["sha256"]) == (2, v2["sha256"])


def test_bind_errors_leave_state_unchanged(client, acme, lora_dir, state_snapshot):
    upload(client, acme, "bot", lora_dir)
    before = state_snapshot()
    resp = client.put("/v1/users/u1", json={"adapter": "ghost"}, headers=acme)
    assert resp.status_code == 404
    assert error_message(resp) == "adapter 'ghost' does not exist; upload it first"
    resp = client.put("/v1/users/bad user", json={"adapter": "bot"}, headers=acme)
    assert resp.status_code == 400
    assert error_message(resp).startswith("user id 'bad user' is invalid: use 1-128 letters")
    for dots in ("%2E", "%2E%2E"):  # valid ids, but no URL path could name the binding
        resp = client.put(f"/v1/users/{dots}", json={"adapter": "bot"}, headers=acme)
        assert resp.status_code == 400
        assert "cannot be bound: URLs fold '.' and '..' path segments" in error_message(resp)
    resp = client.put("/v1/users/u1", json={"adapter": "../x"}, headers=acme)
    assert resp.status_code == 400
    assert error_message(resp).startswith("adapter name '../x' is invalid")
    resp = client.put("/v1/users/u1", json={}, headers=acme)
    assert resp.status_code == 422
    assert error_message(resp) == "invalid request: adapter: field required"
    resp = client.put(
        "/v1/users/u1", content=b"not json", headers={**acme, "Content-Type": "application/json"}
    )
    assert resp.status_code == 422
    assert state_snapshot() == before


def test_get_unbound_user(client, acme):
    resp = client.get("/v1/users/nobody", headers=acme)
    assert resp.status_code == 404
    assert error_message(resp) == "user 'nobody' is not bound to an adapter"
