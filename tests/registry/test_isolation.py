"""A tenant cannot list, read, update, delete or bind another tenant's adapters, and cannot
tell whether a name exists in another tenant (every answer equals the one for a name that
exists nowhere)."""

from __future__ import annotations

from tests.support.registry_api import upload


def _strip(resp) -> tuple[int, dict]:
    return resp.status_code, resp.json()


def test_tenants_are_isolated(client, new_tenant, lora_dir, lora_dir2, state_snapshot):
    acme, other = new_tenant("acme"), new_tenant("other")
    secret = upload(client, acme, "secret-bot", lora_dir).json()
    client.put("/v1/users/alice", json={"adapter": "secret-bot"}, headers=acme)
    acme_view = client.get("/v1/adapters/secret-bot", headers=acme).json()

    # list
    assert client.get("/v1/adapters", headers=other).json() == {"items": [], "next_cursor": None}
    # read: same answer as a name that exists nowhere
    before = state_snapshot()
    for method, path, kwargs in [
        ("GET", "/v1/adapters/{}", {}),
        ("DELETE", "/v1/adapters/{}", {}),
        ("DELETE", "/v1/adapters/{}?force=true", {}),
        ("PUT", "/v1/users/bob", {"json": {"adapter": "{}"}}),
    ]:

        def call(name: str, method=method, path=path, kwargs=kwargs):
            kw = dict(kwargs)
            if "json" in kw:
                kw["json"] = {"adapter": name}
            return client.request(method, path.format(name), headers=other, **kw)

        existing, missing = call("secret-bot"), call("never-existed")
        assert existing.status_code == missing.status_code == 404
        assert existing.json()["error"]["message"] == missing.json()["error"]["message"].replace(
            "never-existed", "secret-bot"
        )
    # the other tenant cannot see acme's user binding either
    resp = client.get("/v1/users/alice", headers=other)
    assert resp.status_code == 404
    assert client.delete("/v1/users/alice", headers=other).status_code == 404
    assert state_snapshot() == before

    # update: a POST of the same name is a *new* adapter in the other tenant (no conflict
    # that would reveal the name), and PUT never touches acme's versions.
    created = upload(client, other, "secret-bot", lora_dir2)
    assert created.status_code == 201 and created.json()["version"] == 1
    put = upload(client, other, "secret-bot", lora_dir, method="PUT")
    assert put.status_code == 201 and put.json()["version"] == 2
    assert client.get("/v1/adapters/secret-bot", headers=acme).json() == acme_view
    assert client.get("/v1/users/alice", headers=acme).json()["sha256"] == secret["sha256"]
    # identical content in two tenants: same digest, separate metadata
    assert put.json()["sha256"] == secret["sha256"]
    assert client.delete("/v1/adapters/secret-bot", headers=other).status_code == 204
    assert client.get("/v1/adapters/secret-bot", headers=acme).json() == acme_view
