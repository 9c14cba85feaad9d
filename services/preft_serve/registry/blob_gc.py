"""Deleting stored contents that no adapter version references any more.

Contents are shared by digest across names and tenants, so deleting an adapter (or a
tenant) may leave its contents referenced elsewhere, or by nobody. Left in place, they
were outside every quota: a tenant that uploaded, deleted and uploaded again grew the
object store without bound. After such a delete, :func:`collect_unreferenced` removes the
digests no version of any adapter names.

An upload of the same content may be committing at that moment (it found the content in
the store and skipped writing it). Two marks keep it whole:

* every version written bumps its content's ``gen`` field (``queue_reference``); the
  collector reads the generations before it looks for references, and deletes a content
  only if its generation is unchanged, checked under WATCH with the delete;
* the delete itself sets ``blob_deleting`` while the store's objects go, and a commit
  that finds it (``being_deleted``, WATCHed) waits, stores the content again and retries.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from preft_serve.common.objectstore import ObjectStore, ObjectStoreError
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry.txn import Redis, transact

logger = logging.getLogger(__name__)

GEN_FIELD = "gen"
DELETING_TTL_S = 300
"""How long a delete's mark outlives a collector that died before clearing it."""


def queue_reference(pipe: Any, keys: RegistryKeys, sha256: str) -> None:
    """Mark ``sha256`` referenced again, in the version's own transaction."""
    pipe.hincrby(keys.blob(sha256), GEN_FIELD, 1)


def being_deleted(pipe: Any, keys: RegistryKeys, sha256: str) -> bool:
    """Whether the collector is removing ``sha256`` from the store right now."""
    return bool(pipe.exists(keys.blob_deleting(sha256)))


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
    gens = _generations(client, keys, candidates)
    still = referenced(client, keys)
    deleted = 0
    for sha256 in candidates:
        if sha256 in still or not _unlink(client, keys, sha256, gens[sha256]):
            continue
        try:
            store.delete_adapter(sha256)
        except ObjectStoreError as exc:  # the mark expires; the objects are garbage now
            logger.warning("could not delete unreferenced content %s: %s", sha256, exc)
            continue
        client.delete(keys.blob_deleting(sha256))
        deleted += 1
    return deleted


def _generations(client: Redis, keys: RegistryKeys, digests: list[str]) -> dict[str, str | None]:
    pipe = client.pipeline(transaction=False)
    for sha256 in digests:
        pipe.hget(keys.blob(sha256), GEN_FIELD)
    return dict(zip(digests, pipe.execute(), strict=True))


def _unlink(client: Redis, keys: RegistryKeys, sha256: str, gen: str | None) -> bool:
    """Drop the blob record and set the delete's mark, if no version referenced the
    content since ``gen`` was read."""

    def txn(pipe: Any) -> bool:
        if pipe.hget(keys.blob(sha256), GEN_FIELD) != gen:
            return False
        pipe.multi()
        pipe.delete(keys.blob(sha256))
        pipe.set(keys.blob_deleting(sha256), "1", ex=DELETING_TTL_S)
        return True

    return bool(transact(client, txn, keys.blob(sha256)))
