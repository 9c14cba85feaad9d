"""Deleting a tenant: its keys, bindings, adapters and the contents only it referenced.

Metadata goes first, in one optimistic transaction over every key under the tenant's
prefix plus its API-key records, with the events that caches already understand
(``apikey.revoked``, ``binding.deleted``, ``adapter.deleted``), so gateways stop accepting
its keys and forget its bindings at once. Contents (blobs) are shared by digest across
names and tenants, so after the commit each of the tenant's digests is deleted only if no
version of any remaining adapter references it. An upload of the same content by another
tenant that is in flight at that moment (blob found present, metadata not yet committed)
could lose its blob; that window is the same one blob garbage collection has to handle.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from preft_serve.common.errors import NotFound
from preft_serve.common.objectstore import ObjectStore, ObjectStoreError
from preft_serve.common.registry_client import EventType, RegistryEvent, RegistryKeys
from preft_serve.registry.events import queue_event
from preft_serve.registry.names import check_tenant_name
from preft_serve.registry.text import shown
from preft_serve.registry.txn import Redis, transact

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Removed:
    keys: int
    adapters: int
    bindings: int
    digests: frozenset[str]


def delete_tenant(client: Redis, keys: RegistryKeys, store: ObjectStore, tenant: str,
                  maxlen: int) -> tuple[int, int, int, int]:
    """Delete ``tenant``; returns (keys, adapters, bindings, blobs) removed."""
    check_tenant_name(tenant)
    prefix = keys.tenant(tenant)

    def txn(pipe: Any) -> _Removed:
        if not pipe.exists(prefix):
            raise NotFound(f"tenant {shown(tenant)} does not exist")
        owned = sorted(pipe.scan_iter(match=f"{prefix}:*", count=1000))
        if owned:
            pipe.watch(prefix, *owned)
        key_records = [json.loads(v) for v in pipe.hvals(keys.tenant_keys(tenant))]
        names = pipe.zrange(keys.adapters(tenant), 0, -1)
        users: dict[str, list[str]] = {}
        digests: set[str] = set()
        for name in names:
            users[name] = sorted(pipe.smembers(keys.adapter_users(tenant, name)))
            digests.update(json.loads(v)["sha256"]
                           for v in pipe.hvals(keys.versions(tenant, name)))
        pipe.multi()
        pipe.delete(prefix, *owned)
        pipe.srem(keys.tenants, tenant)
        for record in key_records:
            pipe.delete(keys.api_key(record["hash"]))
            queue_event(pipe, keys, RegistryEvent(EventType.API_KEY_REVOKED.value, tenant,
                                                  key_id=record["key_id"]), maxlen)
        for name in names:
            for user in users[name]:
                queue_event(pipe, keys, RegistryEvent(EventType.BINDING_DELETED.value, tenant,
                                                      adapter=name, user=user), maxlen)
            queue_event(pipe, keys, RegistryEvent(EventType.ADAPTER_DELETED.value, tenant,
                                                  adapter=name), maxlen)
        return _Removed(len(key_records), len(names), sum(map(len, users.values())),
                        frozenset(digests))

    removed = transact(client, txn, prefix, keys.tenant_keys(tenant), keys.adapters(tenant))
    _delete_rate_limits(client, keys, tenant)
    blobs = _delete_unreferenced(client, keys, store, removed.digests)
    logger.info("deleted tenant %s: %d keys, %d adapters, %d bindings, %d blobs", tenant,
                removed.keys, removed.adapters, removed.bindings, blobs)
    return removed.keys, removed.adapters, removed.bindings, blobs


def _delete_rate_limits(client: Redis, keys: RegistryKeys, tenant: str) -> None:
    """The gateway's token buckets ``{ns}:ratelimit:{bucket}:{tenant}[:{user}]``."""
    start = f"{keys.ns}:ratelimit:"
    doomed = [k for k in client.scan_iter(match=f"{start}*", count=1000)
              if k[len(start):].split(":")[1:2] == [tenant]]
    if doomed:
        client.delete(*doomed)


def _referenced(client: Redis, keys: RegistryKeys) -> set[str]:
    """Digests named by any version of any adapter of any tenant."""
    found: set[str] = set()
    for key in client.scan_iter(match=f"{keys.ns}:tenant:*:adapter:*:versions", count=1000):
        found.update(json.loads(v)["sha256"] for v in client.hvals(key))
    return found


def _delete_unreferenced(client: Redis, keys: RegistryKeys, store: ObjectStore,
                         digests: frozenset[str]) -> int:
    if not digests:
        return 0
    deleted = 0
    for sha256 in sorted(digests - _referenced(client, keys)):
        try:
            store.delete_adapter(sha256)
        except ObjectStoreError as exc:  # metadata is gone; the blob is merely garbage now
            logger.warning("could not delete blob %s of a deleted tenant: %s", sha256, exc)
            continue
        client.delete(keys.blob(sha256))
        deleted += 1
    return deleted
