"""Deleting stored contents that no adapter version references any more.

Contents are shared by digest across names and tenants, so deleting an adapter (or a
tenant) may leave its contents referenced elsewhere, or by nobody. Left in place, they
were outside every quota: a tenant that uploaded, deleted and uploaded again grew the
object store without bound. After such a delete, :func:`collect_unreferenced` removes the
digests no version of any adapter names.

An upload of the same content may be between storing it (or finding it stored) and
committing its version while that happens. Three marks keep such an upload from
committing a version of deleted content:

* every version written bumps its content's ``gen`` (:func:`queue_reference`);
* every delete sets the content's epoch to a new random token (``blob_epoch``, kept a day);
* while the objects go, ``blob_deleting`` is set.

The collector reads each candidate's (gen, epoch) before it looks for references and
deletes only if neither moved, checked under WATCH with the unlink (which sets a new
epoch and the mark): a version committed after the search began, or another collector's
delete, stops it. When the objects are gone it clears the mark and sets a new epoch again.
An upload reads the epoch and the mark together before it stores the content, waiting
while a delete is in progress (:func:`epoch_to_store`), and commits only if the epoch is
unchanged and no delete is in progress (WATCHed, :func:`stored_since`); otherwise it
stores the content again and retries.
"""

from __future__ import annotations

import json
import logging
import queue
import secrets
import threading
import time
from collections.abc import Iterable
from typing import Any

from preft_serve.common.domain_errors import Unavailable
from preft_serve.common.objectstore import ObjectStore, ObjectStoreError
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry.txn import Redis, transact

logger = logging.getLogger(__name__)

GEN_FIELD = "gen"
DELETING_TTL_S = 1800
"""How long a delete's mark outlives a collector that died before clearing it: longer than
the object store client's worst case for two deletes (boto3: 60 s connect + 60 s read, 5
attempts each)."""
EPOCH_TTL_S = 86400
"""How long a delete's epoch token is kept: far longer than an upload takes from reading
it to committing (a token that expired reads as None, which no later token equals)."""


def queue_reference(pipe: Any, keys: RegistryKeys, sha256: str) -> None:
    """Mark ``sha256`` referenced again, in the version's own transaction."""
    pipe.hincrby(keys.blob(sha256), GEN_FIELD, 1)


def epoch_to_store(client: Redis, keys: RegistryKeys, sha256: str, deadline: float) -> str | None:
    """The content's delete epoch, read (with the delete mark, atomically) before an upload
    stores it. While a delete is in progress it waits for it to end (its objects may be
    half gone: storing now could be undone by the delete), until ``deadline``
    (``time.monotonic``), then refuses with 503."""
    while True:
        pipe = client.pipeline(transaction=True)
        pipe.get(keys.blob_epoch(sha256))
        pipe.exists(keys.blob_deleting(sha256))
        value, deleting = pipe.execute()
        if not deleting:
            return str(value) if value is not None else None
        if time.monotonic() > deadline:
            raise Unavailable(
                "this adapter's content is being removed from the store as unreferenced; "
                "retry the upload shortly"
            )
        time.sleep(0.05)


def stored_since(pipe: Any, keys: RegistryKeys, sha256: str, read: str | None) -> bool:
    """Whether the content an upload stored (or found) at epoch ``read`` is still there:
    no delete began since and none is in progress. Call inside a transaction that
    WATCHes :func:`watched_keys`."""
    return pipe.get(keys.blob_epoch(sha256)) == read and not pipe.exists(keys.blob_deleting(sha256))


def watched_keys(keys: RegistryKeys, sha256: str) -> tuple[str, str]:
    """What a commit of a version of ``sha256`` WATCHes besides its own keys."""
    return keys.blob_epoch(sha256), keys.blob_deleting(sha256)


def referenced(client: Redis, keys: RegistryKeys) -> set[str]:
    """Digests named by any version of any adapter of any tenant (one SCAN of the key
    space, the histories read in pipelined batches)."""
    found: set[str] = set()
    batch: list[str] = []

    def read(names: list[str]) -> None:
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.hvals(name)
        for records in pipe.execute():
            found.update(json.loads(r)["sha256"] for r in records)

    for key in client.scan_iter(match=f"{keys.ns}:tenant:*:adapter:*:versions", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            read(batch)
            batch = []
    if batch:
        read(batch)
    return found


def collect_unreferenced(
    client: Redis, keys: RegistryKeys, store: ObjectStore, digests: Iterable[str]
) -> int:
    """Delete those of ``digests`` that no version references (store objects and blob
    record); returns how many went. Store failures are logged: the content is then only
    garbage, never a reference to something missing."""
    candidates = sorted(set(digests))
    if not candidates:
        return 0
    marks = _marks(client, keys, candidates)
    still = referenced(client, keys)
    deleted = 0
    for sha256 in candidates:
        if sha256 in still or not _unlink(client, keys, sha256, marks[sha256]):
            continue
        try:
            store.delete_adapter(sha256)
        except ObjectStoreError as exc:  # the objects are garbage now, never referenced
            logger.warning("could not delete unreferenced content %s: %s", sha256, exc)
            continue
        finally:  # uploads waiting for it store it again; a new epoch fails any other
            _end_delete(client, keys, sha256)
        deleted += 1
    return deleted


def _end_delete(client: Redis, keys: RegistryKeys, sha256: str) -> None:
    """Clear the delete's mark with a new epoch, in one transaction: an upload that read
    the epoch while the objects went (and found them, or stored them half-deleted) cannot
    commit on that read."""
    pipe = client.pipeline(transaction=True)
    pipe.set(keys.blob_epoch(sha256), secrets.token_hex(8), ex=EPOCH_TTL_S)
    pipe.delete(keys.blob_deleting(sha256))
    pipe.execute()


def _marks(
    client: Redis, keys: RegistryKeys, digests: list[str]
) -> dict[str, tuple[str | None, str | None]]:
    """Each digest's (gen, epoch) before the search for references."""
    pipe = client.pipeline(transaction=False)
    for sha256 in digests:
        pipe.hget(keys.blob(sha256), GEN_FIELD)
        pipe.get(keys.blob_epoch(sha256))
    values = pipe.execute()
    return {sha: (values[2 * i], values[2 * i + 1]) for i, sha in enumerate(digests)}


def _unlink(
    client: Redis, keys: RegistryKeys, sha256: str, mark: tuple[str | None, str | None]
) -> bool:
    """Drop the blob record, start a new epoch and set the delete's mark, if no version
    referenced the content and no other delete began since ``mark`` was read."""

    def txn(pipe: Any) -> bool:
        now = (pipe.hget(keys.blob(sha256), GEN_FIELD), pipe.get(keys.blob_epoch(sha256)))
        if now != mark:
            return False
        pipe.multi()
        pipe.delete(keys.blob(sha256))
        pipe.set(keys.blob_epoch(sha256), secrets.token_hex(8), ex=EPOCH_TTL_S)
        pipe.set(keys.blob_deleting(sha256), "1", ex=DELETING_TTL_S)
        return True

    return bool(transact(client, txn, keys.blob(sha256), keys.blob_epoch(sha256)))


def collect_after_delete(
    client: Redis, keys: RegistryKeys, store: ObjectStore, digests: Iterable[str]
) -> int:
    """:func:`collect_unreferenced` after a delete that has committed: a failure is
    logged, not raised (the delete stands; its contents are left as garbage)."""
    try:
        return collect_unreferenced(client, keys, store, digests)
    except Exception:
        logger.exception("could not collect the contents of a deleted adapter or tenant")
        return 0


class ContentCollector:
    """Collects deleted adapters' contents in a background thread, so a delete answers as
    soon as its metadata commit is done, however large the registry or slow the store (a
    paused store held deletes for as long as it was paused). Deletes queued close together
    share one search for references. Queued digests a registry dies with stay as garbage.
    """

    def __init__(self, client: Redis, keys: RegistryKeys, store: ObjectStore) -> None:
        self.client, self.keys, self.store = client, keys, store
        self._queue: queue.Queue[frozenset[str] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="content-collector", daemon=True)
        self._thread.start()

    def submit(self, digests: Iterable[str]) -> None:
        """Collect these after their delete (collected at once when not started)."""
        batch = frozenset(digests)
        if not batch:
            return
        if self._thread is None:
            collect_after_delete(self.client, self.keys, self.store, batch)
            return
        self._queue.put(batch)

    def wait(self) -> None:
        """Until everything submitted so far was collected (tests; shutdown)."""
        self._queue.join()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Collect what is queued (for at most ``timeout_s``), then end the thread."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout_s)
        self._thread = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            batch: set[str] = set()
            done = 1
            stopping = item is None
            if item is not None:
                batch |= item
            while not self._queue.empty():  # deletes queued meanwhile: one search for all
                more = self._queue.get()
                done += 1
                if more is None:
                    stopping = True
                else:
                    batch |= more
            if batch:
                collect_after_delete(self.client, self.keys, self.store, batch)
            for _ in range(done):
                self._queue.task_done()
            if stopping:
                return
