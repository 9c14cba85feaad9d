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


def _delete(client: Any, headers: dict[str, str], name: str) -> None:
    """Delete an adapter and wait for the collector's thread to collect its contents."""
    assert client.delete(f"/v1/adapters/{name}", headers=headers).status_code == 204
    client.app.state.registry.adapters.collector.wait()


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
    _delete(client, acme, "bot")
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
    _delete(client, acme, "bot")
    _delete(client, acme, "twin")
    assert len(_objects(s3, bucket)) == 2  # globex still serves it
    store = settings.object_store.create()
    store.fetch_adapter(sha, tmp_path / "fetched")  # whole: re-hashed against its digest
    _delete(client, globex, "bot")
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
    _delete(client, acme, "bot")
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


def _unreferenced(
    client: Any, redis_client: Any, keys: RegistryKeys, acme: Any, lora_dir: Path
) -> str:
    """Content stored and recorded but named by no version (its adapter's metadata gone)."""
    sha = upload(client, acme, "bot", lora_dir).json()["sha256"]
    redis_client.delete(keys.versions("acme", "bot"), keys.adapter("acme", "bot"))
    redis_client.zrem(keys.adapters("acme"), "bot")
    return sha


def test_a_collection_between_an_uploads_store_and_its_commit_is_not_committed_over(
    client, acme, lora_dir, settings, tmp_path, redis_client, namespace, monkeypatch
) -> None:
    """The upload finds the content stored and skips writing it; the collector deletes it
    before the upload commits. The commit sees the new epoch, stores the content again
    and commits then: the version's content is in the store."""
    keys = RegistryKeys(namespace)
    sha = _unreferenced(client, redis_client, keys, acme, lora_dir)
    store = client.app.state.registry.adapters.store
    real_put = store.put_adapter
    puts: list[bool] = []

    def put_then_collect(*args: Any, **kwargs: Any) -> bool:
        wrote = real_put(*args, **kwargs)
        puts.append(wrote)
        if len(puts) == 1:  # the collector runs in the gap, once
            assert blob_gc.collect_unreferenced(redis_client, keys, store, [sha]) == 1
        return wrote

    monkeypatch.setattr(store, "put_adapter", put_then_collect)
    resp = upload(client, acme, "twin", lora_dir)
    assert resp.status_code == 201, resp.text
    assert puts == [False, True]  # found it stored, then stored it again
    settings.object_store.create().fetch_adapter(sha, tmp_path / "fetched")


def test_a_collector_that_read_before_another_deleted_and_recreated_stops(
    client, acme, lora_dir, settings, tmp_path, redis_client, namespace
) -> None:
    """Two collectors of one content: the second read its marks, then the first deleted
    the content and an upload recreated it (its ``gen`` back at the same value). The new
    epoch stops the second from deleting live content."""
    keys = RegistryKeys(namespace)
    sha = _unreferenced(client, redis_client, keys, acme, lora_dir)
    store = client.app.state.registry.adapters.store
    late = blob_gc._marks(redis_client, keys, [sha])[sha]
    assert blob_gc.collect_unreferenced(redis_client, keys, store, [sha]) == 1
    assert upload(client, acme, "twin", lora_dir).status_code == 201
    assert redis_client.hget(keys.blob(sha), "gen") == late[0]  # the same gen again
    assert blob_gc._unlink(redis_client, keys, sha, late) is False
    settings.object_store.create().fetch_adapter(sha, tmp_path / "fetched")


def test_a_store_failure_leaves_garbage_and_no_mark_behind(
    client, acme, lora_dir, redis_client, namespace, monkeypatch, caplog
) -> None:
    from preft_serve.common.objectstore import StoreUnavailable

    keys = RegistryKeys(namespace)
    store = client.app.state.registry.adapters.store
    sha = upload(client, acme, "bot", lora_dir).json()["sha256"]

    def down(_sha: str) -> None:
        raise StoreUnavailable("unreachable")

    monkeypatch.setattr(store, "delete_adapter", down)
    _delete(client, acme, "bot")
    assert f"could not delete unreferenced content {sha}" in caplog.text
    assert not redis_client.exists(keys.blob_deleting(sha))  # uploads of it need not wait
    monkeypatch.undo()
    # A mark left behind would hold the upload until its deadline, then refuse it (503).
    assert upload(client, acme, "bot", lora_dir).status_code == 201


def test_a_delete_stands_when_its_collection_fails(
    client, acme, lora_dir, monkeypatch, caplog
) -> None:
    import redis

    def down(*_: Any) -> set[str]:
        raise redis.ConnectionError("Connection refused")

    upload(client, acme, "bot", lora_dir)
    monkeypatch.setattr(blob_gc, "referenced", down)
    _delete(client, acme, "bot")
    assert client.get("/v1/adapters/bot", headers=acme).status_code == 404
    assert "could not collect the contents of a deleted adapter or tenant" in caplog.text


def test_an_upload_that_starts_while_the_objects_go_waits_and_stores_them_again(
    client, acme, lora_dir, settings, tmp_path, redis_client, namespace, monkeypatch
) -> None:
    """The collector has unlinked the content and is deleting its objects when an upload
    of the same content starts (it would find them, or half of them, still there). The
    upload waits for the delete to end, then stores the content again and commits."""
    keys = RegistryKeys(namespace)
    sha = _unreferenced(client, redis_client, keys, acme, lora_dir)
    store = client.app.state.registry.adapters.store
    real_delete, real_put = store.delete_adapter, store.put_adapter
    answer: dict[str, Any] = {}
    puts_during_delete: list[bool] = []

    def put(*args: Any, **kwargs: Any) -> bool:  # never while the objects go
        puts_during_delete.append(bool(redis_client.exists(keys.blob_deleting(sha))))
        return real_put(*args, **kwargs)

    def upload_meanwhile(digest: str) -> None:
        thread = threading.Thread(
            target=lambda: answer.update(resp=upload(client, acme, "twin", lora_dir))
        )
        thread.start()
        time.sleep(0.5)
        assert thread.is_alive()  # waiting for the delete to end
        real_delete(digest)
        answer["thread"] = thread

    monkeypatch.setattr(store, "delete_adapter", upload_meanwhile)
    monkeypatch.setattr(store, "put_adapter", put)
    assert blob_gc.collect_unreferenced(redis_client, keys, store, [sha]) == 1
    answer["thread"].join(10)
    assert answer["resp"].status_code == 201, answer["resp"].text
    assert puts_during_delete == [False]  # one put, after the delete ended
    settings.object_store.create().fetch_adapter(sha, tmp_path / "fetched")


def test_an_epoch_read_while_the_objects_went_cannot_be_committed_on(
    client, acme, lora_dir, redis_client, namespace, monkeypatch
) -> None:
    """Ending a delete sets a new epoch: an upload that read the epoch during the delete
    (and found the objects, or stored them half-deleted) is refused at its commit."""
    from preft_serve.adapters.format import AdapterMode, AdapterType
    from preft_serve.registry.adapters import ContentBeingDeleted
    from preft_serve.registry.validation import ValidatedAdapter

    keys = RegistryKeys(namespace)
    sha = _unreferenced(client, redis_client, keys, acme, lora_dir)
    service = client.app.state.registry.adapters
    store = service.store
    real_delete = store.delete_adapter
    during: list[str | None] = []

    def read_epoch_then_delete(digest: str) -> None:
        during.append(redis_client.get(keys.blob_epoch(digest)))
        real_delete(digest)

    monkeypatch.setattr(store, "delete_adapter", read_epoch_then_delete)
    assert blob_gc.collect_unreferenced(redis_client, keys, store, [sha]) == 1
    version = ValidatedAdapter(
        config={},
        config_bytes=b"{}",
        weights_path=Path("/dev/null"),
        type=AdapterType.LORA,
        mode=AdapterMode.PREFILL,
        rank=8,
        sha256=sha,
        size_bytes=10,
        base_model="tiny-llama",
    )
    try:
        service.commit("acme", "twin", version, create=True, stored_at=during[0])
    except ContentBeingDeleted:
        pass
    else:
        raise AssertionError("committed on an epoch read while the content was deleted")
    assert client.get("/v1/adapters/twin", headers=acme).status_code == 404


def test_a_rollback_to_content_of_an_earlier_incarnation_is_refused(
    client, acme, lora_dir, tmp_path, monkeypatch
) -> None:
    """Between reading the version to roll back to and committing, the adapter was deleted
    and created again: its version 1 is other content now. The rollback re-reads the
    history in its transaction and refuses instead of naming content no history holds."""
    from preft_serve.registry.adapters import AdapterService

    other = _variant(lora_dir, tmp_path / "other")
    first = upload(client, acme, "bot", lora_dir).json()["sha256"]
    upload(client, acme, "bot", _variant(lora_dir, tmp_path / "v2"), method="PUT")
    upload(client, acme, "keep", lora_dir)  # keeps the first content in the store
    real_version = AdapterService.version

    def read_then_recreate(self: Any, tenant: str, name: str, version: int | None) -> Any:
        target = real_version(self, tenant, name, version)
        monkeypatch.setattr(AdapterService, "version", real_version)
        _delete(client, acme, "bot")
        assert upload(client, acme, "bot", other).status_code == 201
        return target

    monkeypatch.setattr(AdapterService, "version", read_then_recreate)
    resp = client.post("/v1/adapters/bot/rollback", json={"version": 1}, headers=acme)
    assert resp.status_code == 404
    assert "has no version 1 with that content any more" in error_message(resp)
    detail = client.get("/v1/adapters/bot", headers=acme).json()
    assert detail["version"] == 1 and detail["sha256"] != first


def test_a_delete_answers_without_waiting_for_the_store(
    client, acme, lora_dir, s3, bucket, monkeypatch
) -> None:
    """The store is stuck (paused, say): the delete still answers at once; its contents
    go when the store answers again."""
    store = client.app.state.registry.adapters.store
    real_delete = store.delete_adapter
    stuck = threading.Event()

    def paused(sha: str) -> None:
        stuck.wait(30)
        real_delete(sha)

    upload(client, acme, "bot", lora_dir)
    monkeypatch.setattr(store, "delete_adapter", paused)
    started = time.monotonic()
    assert client.delete("/v1/adapters/bot", headers=acme).status_code == 204
    assert time.monotonic() - started < 5
    assert client.get("/v1/adapters/bot", headers=acme).status_code == 404
    assert len(_objects(s3, bucket)) == 2  # not yet
    stuck.set()
    client.app.state.registry.adapters.collector.wait()
    assert _objects(s3, bucket) == []
