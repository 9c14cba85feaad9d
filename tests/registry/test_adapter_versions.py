"""Rollback (POST /v1/adapters/{name}/rollback), download and GET /v1/users."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from preft_serve.common.registry_client import RegistryKeys
from tests.support.registry_api import upload


def test_rollback_is_a_new_version_with_the_upload_event(
    client, acme, lora_dir, lora_dir2, redis_client, namespace, state_snapshot
):
    keys = RegistryKeys(namespace)
    v1 = upload(client, acme, "bot", lora_dir).json()
    v2 = upload(client, acme, "bot", lora_dir2, method="PUT").json()
    resp = client.post("/v1/adapters/bot/rollback", json={"version": 1}, headers=acme)
    assert resp.status_code == 201, resp.text
    assert resp.json()["version"] == 3 and resp.json()["sha256"] == v1["sha256"]
    last = redis_client.xrevrange(keys.events, count=1)[0][1]
    assert {k: last[k] for k in ("type", "tenant", "adapter", "version", "sha256")} == {
        "type": "adapter.updated",
        "tenant": "acme",
        "adapter": "bot",
        "version": "3",
        "sha256": v1["sha256"],
    }
    detail = client.get("/v1/adapters/bot", headers=acme).json()
    assert [v["sha256"] for v in detail["versions"]] == [v1["sha256"], v2["sha256"], v1["sha256"]]
    assert detail["created_at"] == v1["created_at"]
    snap = state_snapshot()
    again = client.post("/v1/adapters/bot/rollback", json={"version": 1}, headers=acme)
    assert again.status_code == 200 and again.json()["version"] == 3
    assert state_snapshot() == snap
    missing = client.post("/v1/adapters/bot/rollback", json={"version": 7}, headers=acme)
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == (
        "adapter 'bot' has no version 7; its versions are 1 to 3"
    )
    assert (
        client.post("/v1/adapters/bot/rollback", json={"version": 0}, headers=acme).status_code
        == 422
    )
    assert (
        client.post("/v1/adapters/ghost/rollback", json={"version": 1}, headers=acme).status_code
        == 404
    )


def test_download_returns_the_stored_files(client, acme, new_tenant, lora_dir):
    sha = upload(client, acme, "bot", lora_dir).json()["sha256"]
    resp = client.get("/v1/adapters/bot/download", headers=acme)
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/gzip"
    assert resp.headers["x-preft-sha256"] == sha and resp.headers["x-preft-version"] == "1"
    with tarfile.open(fileobj=io.BytesIO(resp.content), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == ["adapter_config.json", "adapter_model.safetensors"]
    # The archive uploads back as the same content.
    files = [("files", ("bot-v1.tar.gz", resp.content, "application/gzip"))]
    again = client.post(
        "/v1/adapters", data={"name": "copy", "mode": "prefill"}, files=files, headers=acme
    )
    assert again.status_code == 201 and again.json()["sha256"] == sha
    other = new_tenant("globex")
    assert client.get("/v1/adapters/bot/download", headers=other).status_code == 404


def test_a_download_leaves_nothing_in_staging_however_it_ends(client, acme, settings, lora_dir):
    """Starlette answers a bad Range header (400, 416) without running a response's
    background task: the exported files must go all the same."""
    upload(client, acme, "bot", lora_dir)
    staging = Path(settings.staging_dir)
    for headers, status in (
        ({}, 200),
        ({"Range": "junk"}, 400),
        ({"Range": "bytes=999999999-"}, 416),
    ):
        resp = client.get("/v1/adapters/bot/download", headers={**acme, **headers})
        assert resp.status_code == status, resp.text
        assert sorted(staging.glob("preft-download-*")) == [], headers


def test_list_users(client, acme, lora_dir):
    upload(client, acme, "bot", lora_dir)
    upload(client, acme, "two", lora_dir, mode="all")
    for user, name in (("zed", "bot"), ("amy", "two"), ("bob", "bot")):
        client.put(f"/v1/users/{user}", json={"adapter": name}, headers=acme)
    assert client.get("/v1/users", headers=acme).json()["items"] == [
        {"user": "amy", "adapter": "two"},
        {"user": "bob", "adapter": "bot"},
        {"user": "zed", "adapter": "bot"},
    ]
    assert [
        b["user"]
        for b in client.get("/v1/users", params={"adapter": "bot"}, headers=acme).json()["items"]
    ] == ["bob", "zed"]
    assert client.get("/v1/users", params={"adapter": "nope"}, headers=acme).status_code == 404
    assert client.get("/v1/users", params={"adapter": "a:b"}, headers=acme).status_code == 400
