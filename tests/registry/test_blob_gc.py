"""Contents no adapter version references are deleted with the last adapter that did,
and an upload of the same content that commits meanwhile keeps it whole.

Before, a deleted adapter's contents stayed in the object store outside every quota: a
tenant that uploaded, deleted and uploaded again grew the store without bound."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry import blob_gc
from tests.registry import factories
from tests.support.registry_api import create_tenant, error_message, upload


def _objects(s3: Any, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []))


def _variant(src: Path, dest: Path) -> Path:
    d = factories.copy_adapter(src, dest)
    return factories.edit_tensors(d, lambda t: {k: (v * 1.5).astype(v.dtype) for k, v in t.items()})


def test_deleting_an_adapter_deletes_every_content_only_it_referenced(
    client, acme, lora_dir, tmp_path, s3, bucket, redis_client, namespace
) -> None:
    keys = RegistryKeys(namespace)
    first = upload(client, acme, "bot", lora_dir).json()["sha256"]
    second = upload(client, acme, "bot", _variant(lora_dir, tmp_path / "v2"), method="PUT")
    second_sha = second.json()["sha256"]
    assert len(_objects(s3, bucket)) == 4
    assert client.delete("/v1/adapters/bot", headers=acme).status_code == 204
    assert _objects(s3, bucket) == []
    assert not redis_client.exists(keys.blob(first), keys.blob(second_sha))
    assert not redis_client.exists(keys.blob_deleting(first))


def test_content_another_adapter_references_stays_until_its_last_reference_goes(
    client, new_tenant, lora_dir, s3, bucket, settings, tmp_path
) -> None:
    acme, globex = new_tenant("acme"), new_tenant("globex")
    sha = upload(client, acme, "bot", lora_dir).json()["sha256"]
    assert upload(client, acme, "twin", lora_dir).json()["sha256"] == sha
    assert upload(client, globex, "bot", lora_dir).json()["sha256"] == sha
    assert client.delete("/v1/adapters/bot", headers=acme).status_code == 204
    assert client.delete("/v1/adapters/twin", headers=acme).status_code == 204
    assert len(_objects(s3, bucket)) == 2  # globex still serves it
    store = settings.object_store.create()
    store.fetch_adapter(sha, tmp_path / "fetched")  # whole: re-hashed against its digest
    assert client.delete("/v1/adapters/bot", headers=globex).status_code == 204
    assert _objects(s3, bucket) == []


def test_an_upload_committing_while_the_collector_looks_keeps_its_content(
    client, acme, lora_dir, s3, bucket, settings, tmp_path, monkeypatch
) -> None:
    """The collector's search for references misses a version committed after it began;
    the content's generation, checked under WATCH with the delete, keeps it."""
    sha = upload(client, acme, "bot", lora_dir).json()["sha256"]
    real = blob_gc.referenced

    def search_then_commit(redis: Any, keys: RegistryKeys) -> set[str]:
        found = real(redis, keys)  # "bot" is being deleted: the content is not in it
        assert upload(client, acme, "twin", lora_dir).status_code == 201  # same content
        return found

    monkeypatch.setattr(blob_gc, "referenced", search_then_commit)
    assert client.delete("/v1/adapters/bot", headers=acme).status_code == 204
    assert len(_objects(s3, bucket)) == 2
    assert client.get("/v1/adapters/twin", headers=acme).json()["sha256"] == sha
    settings.object_store.create().fetch_adapter(sha, tmp_path / "fetched")


def test_an_upload_of_content_being_deleted_waits_and_stores_it_again(
    client, acme, lora_dir, s3, bucket, settings, tmp_path, redis_client, namespace
) -> None:
    """The collector has unlinked the content and is deleting its objects; an upload of
    the same content (which finds the objects still there) waits for the delete to end,
    then stores the content again before it commits."""
    keys = RegistryKeys(namespace)
    sha = upload(client, acme, "bot", lora_dir).json()["sha256"]
    redis_client.delete(keys.blob(sha), keys.versions("acme", "bot"))  # unreferenced now
    redis_client.delete(keys.adapter("acme", "bot"))
    redis_client.zrem(keys.adapters("acme"), "bot")
    redis_client.set(keys.blob_deleting(sha), "1", ex=60)  # the collector, mid-delete
    answer: dict[str, Any] = {}
    uploading = threading.Thread(
        target=lambda: answer.update(resp=upload(client, acme, "twin", lora_dir))
    )
    uploading.start()
    time.sleep(0.5)
    assert uploading.is_alive()  # waiting for the delete to end
    settings.object_store.create().delete_adapter(sha)  # the collector finishes
    redis_client.delete(keys.blob_deleting(sha))
    uploading.join(10)
    assert answer["resp"].status_code == 201, answer["resp"].text
    assert len(_objects(s3, bucket)) == 2  # stored again
    settings.object_store.create().fetch_adapter(sha, tmp_path / "fetched")


def test_an_upload_waits_for_a_delete_only_so_long(
    client, acme, lora_dir, redis_client, namespace, state_snapshot, monkeypatch
) -> None:
    from preft_serve.registry import adapters

    monkeypatch.setattr(adapters, "CONTENT_DELETE_WAIT_S", 0.2)
    keys = RegistryKeys(namespace)
    other = create_tenant(client, "other")
    sha = upload(client, other, "bot", lora_dir).json()["sha256"]
    redis_client.set(keys.blob_deleting(sha), "1", ex=60)  # a collector that died mid-way
    before = state_snapshot()
    resp = upload(client, acme, "bot", lora_dir)
    assert resp.status_code == 503
    assert "being removed from the store as unreferenced; retry the upload" in error_message(resp)
    assert state_snapshot() == before
