"""One adapter keeps at most ``MAX_VERSIONS_PER_ADAPTER`` versions: re-uploading two
contents in turn (free under the byte quota, which counts each content once) or rolling
back in a loop would otherwise grow its history in Redis without bound."""

from __future__ import annotations

import time
from typing import Any

from tests.support.registry_api import create_tenant, upload


def test_an_adapter_at_its_version_limit_refuses_more_and_stores_nothing(
    make_client, state_snapshot, lora_dir, lora_dir2
) -> None:
    client = make_client(max_versions_per_adapter=3)
    acme = create_tenant(client, "acme")
    assert upload(client, acme, "bot", lora_dir).status_code == 201
    for folder in (lora_dir2, lora_dir):  # A, B, A again: three versions
        assert upload(client, acme, "bot", folder, method="PUT").status_code == 201
    versions = client.get("/v1/adapters/bot", headers=acme).json()["versions"]
    assert len(versions) == 3

    before = state_snapshot()
    refused = upload(client, acme, "bot", lora_dir2, method="PUT")
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("quota_exceeded", "name")
    assert "adapter 'bot' already has 3 versions" in error["message"]
    assert "(PREFT_REGISTRY_MAX_VERSIONS_PER_ADAPTER)" in error["message"]
    rollback = client.post("/v1/adapters/bot/rollback", json={"version": 2}, headers=acme)
    assert rollback.status_code == 403
    assert rollback.json()["error"]["code"] == "quota_exceeded"
    # the current content again is no new version: answered as before, nothing added
    assert upload(client, acme, "bot", lora_dir, method="PUT").status_code == 200
    assert state_snapshot() == before

    # other adapters are not affected; a deleted adapter starts its history again
    assert upload(client, acme, "other", lora_dir2).status_code == 201
    assert client.delete("/v1/adapters/bot", headers=acme).status_code == 204
    assert upload(client, acme, "bot", lora_dir2).json()["version"] == 1


def test_new_content_refused_at_the_limit_is_not_left_in_the_store(
    make_client, state_snapshot, lora_dir, lora_dir2, base_model_dir, tmp_path, monkeypatch
) -> None:
    """Refused before it is stored; and when only the commit sees the limit (another writer
    got there first), the content it stored is collected again."""
    from tests.registry import factories

    third = factories.lora(base_model_dir, tmp_path / "third", seed=3)
    client = make_client(max_versions_per_adapter=2)
    acme = create_tenant(client, "acme")
    assert upload(client, acme, "bot", lora_dir).status_code == 201
    assert upload(client, acme, "bot", lora_dir2, method="PUT").status_code == 201
    before = state_snapshot()
    assert upload(client, acme, "bot", third, method="PUT").status_code == 403
    assert state_snapshot() == before  # nothing in Redis or the bucket

    adapters = client.app.state.registry.adapters
    monkeypatch.setattr(adapters, "check_version_room", lambda tenant, name: None)
    refused = upload(client, acme, "bot", third, method="PUT")
    assert refused.status_code == 403, refused.text  # the commit's own check
    # stored, then collected by the collector's thread: wait for it (bounded). A collection
    # leaves the content's new delete epoch (``blob_gc``), nothing else.

    def kept(snapshot: dict[str, Any]) -> dict[str, Any]:
        redis = {k: v for k, v in snapshot["redis"].items() if ":blobepoch:" not in k}
        return {**snapshot, "redis": redis}

    deadline = time.monotonic() + 30
    while kept(state_snapshot()) != kept(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kept(state_snapshot()) == kept(before)
