"""Deleting a tenant: its keys, bindings, adapters, fine-tuning files and jobs, and the
contents only it referenced.

Metadata goes first, in one optimistic transaction over every key under the tenant's
prefix plus its API-key records, with the events that caches already understand
(``apikey.revoked``, ``binding.deleted``, ``adapter.deleted``), so gateways stop accepting
its keys and forget its bindings at once. Contents (blobs) are shared by digest across
names and tenants, so after the commit each of the tenant's digests is deleted only if no
version of any remaining adapter references it (``blob_gc``, which also keeps an upload
of the same content committing at that moment whole).

A tenant with fine-tuning jobs still queued or running is refused (409): a job finishing
after the delete would register its adapter for a tenant that no longer exists. Its files'
and finished jobs' records go in the same transaction; a file's content, like an adapter's,
only when no other file references it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from preft_serve.common.domain_errors import Conflict, NotFound
from preft_serve.common.objectstore import ObjectStore, ObjectStoreError
from preft_serve.common.registry_client import EventType, RegistryEvent, RegistryKeys
from preft_serve.common.text import shown
from preft_serve.registry.blob_gc import collect_after_delete
from preft_serve.registry.events import queue_event
from preft_serve.registry.finetune.files import blob_key
from preft_serve.registry.names import check_tenant_name
from preft_serve.registry.txn import Redis, transact

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Removed:
    keys: int
    adapters: int
    bindings: int
    digests: frozenset[str]
    files: dict[str, str]  # file id -> sha256 of its content
    jobs: int


def delete_tenant(
    client: Redis, keys: RegistryKeys, store: ObjectStore, tenant: str, maxlen: int
) -> tuple[int, int, int, int, int, int]:
    """Delete ``tenant``; returns (keys, adapters, bindings, blobs, files, fine-tuning jobs)
    removed."""
    check_tenant_name(tenant)
    prefix = keys.tenant(tenant)

    def txn(pipe: Any) -> _Removed:
        if not pipe.exists(prefix):
            raise NotFound(f"tenant {shown(tenant)} does not exist")
        owned = sorted(pipe.scan_iter(match=f"{prefix}:*", count=1000))
        if owned:
            pipe.watch(prefix, *owned)
        job_ids = pipe.zrange(keys.tenant_jobs(tenant), 0, -1)
        active = [j for j in job_ids if pipe.zscore(keys.active_jobs, j) is not None]
        if active:
            raise Conflict(
                f"tenant {shown(tenant)} has {len(active)} fine-tuning job(s) queued "
                f"or running ({', '.join(active[:3])}); cancel them first with "
                "POST /v1/fine_tuning/jobs/{id}/cancel",
                code="jobs_active",
            )
        files = {
            f: pipe.hget(keys.file(f), "sha256")
            for f in pipe.zrange(keys.tenant_files(tenant), 0, -1)
        }
        key_records = [json.loads(v) for v in pipe.hvals(keys.tenant_keys(tenant))]
        names = pipe.zrange(keys.adapters(tenant), 0, -1)
        users: dict[str, list[str]] = {}
        digests: set[str] = set()
        for name in names:
            users[name] = sorted(pipe.smembers(keys.adapter_users(tenant, name)))
            digests.update(json.loads(v)["sha256"] for v in pipe.hvals(keys.versions(tenant, name)))
        pipe.multi()
        pipe.delete(prefix, *owned)
        pipe.srem(keys.tenants, tenant)
        for file_id, sha256 in files.items():
            pipe.delete(keys.file(file_id))
            if sha256:
                pipe.srem(keys.file_blob_refs(sha256), file_id)
        for job_id in job_ids:
            pipe.delete(keys.job(job_id), keys.job_events(job_id))
        for record in key_records:
            pipe.delete(keys.api_key(record["hash"]))
            queue_event(
                pipe,
                keys,
                RegistryEvent(EventType.API_KEY_REVOKED.value, tenant, key_id=record["key_id"]),
                maxlen,
            )
        for name in names:
            for user in users[name]:
                queue_event(
                    pipe,
                    keys,
                    RegistryEvent(EventType.BINDING_DELETED.value, tenant, adapter=name, user=user),
                    maxlen,
                )
            queue_event(
                pipe,
                keys,
                RegistryEvent(EventType.ADAPTER_DELETED.value, tenant, adapter=name),
                maxlen,
            )
        return _Removed(
            len(key_records),
            len(names),
            sum(map(len, users.values())),
            frozenset(digests),
            {f: s for f, s in files.items() if s},
            len(job_ids),
        )

    removed = transact(
        client, txn, prefix, keys.tenant_keys(tenant), keys.adapters(tenant), keys.active_jobs
    )
    _delete_rate_limits(client, keys, tenant)
    blobs = collect_after_delete(client, keys, store, removed.digests)
    _delete_unreferenced_files(client, keys, store, removed.files)
    logger.info(
        "deleted tenant %s: %d keys, %d adapters, %d bindings, %d blobs, %d files, "
        "%d fine-tuning jobs",
        tenant,
        removed.keys,
        removed.adapters,
        removed.bindings,
        blobs,
        len(removed.files),
        removed.jobs,
    )
    return (
        removed.keys,
        removed.adapters,
        removed.bindings,
        blobs,
        len(removed.files),
        removed.jobs,
    )


def _delete_unreferenced_files(
    client: Redis, keys: RegistryKeys, store: ObjectStore, files: dict[str, str]
) -> None:
    """Fine-tuning file contents no file of any tenant references any more."""
    for sha256 in sorted(set(files.values())):
        if client.scard(keys.file_blob_refs(sha256)) == 0:
            try:
                store.delete(blob_key(sha256))
            except ObjectStoreError as exc:
                logger.warning(
                    "could not delete file content %s of a deleted tenant: %s", sha256, exc
                )


def _delete_rate_limits(client: Redis, keys: RegistryKeys, tenant: str) -> None:
    """The gateway's token buckets ``{ns}:ratelimit:{bucket}:{tenant}[:{user}]``."""
    start = f"{keys.ns}:ratelimit:"
    doomed = [
        k
        for k in client.scan_iter(match=f"{start}*", count=1000)
        if k[len(start) :].split(":")[1:2] == [tenant]
    ]
    if doomed:
        client.delete(*doomed)
