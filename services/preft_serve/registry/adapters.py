"""Adapter upload, versioning, listing and deletion (the logic behind /v1/adapters).

Write order is what makes crashes harmless: validate in a private staging directory, put
the blob into the object store under its digest, and only then commit metadata in one
Redis MULTI/EXEC (current version, version history, name index, blob record and the
change event together). A crash before the commit leaves an unreferenced blob and no
metadata; the commit itself is all-or-nothing. Concurrent writers to one name are
serialised by WATCH on the adapter's key, so versions stay consecutive and none is lost.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE, AdapterMode, AdapterType
from preft_serve.common.domain_errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    Unavailable,
)
from preft_serve.common.objectstore import ObjectNotFound, ObjectStore
from preft_serve.common.registry_client import EventType, RegistryEvent, RegistryKeys
from preft_serve.common.text import shown
from preft_serve.registry.bindings import uncount_users
from preft_serve.registry.blob_gc import (
    ContentCollector,
    epoch_to_store,
    queue_reference,
    stored_since,
    watched_keys,
)
from preft_serve.registry.events import queue_event
from preft_serve.registry.ingest import UploadedFile, stage_upload
from preft_serve.registry.names import check_adapter_name, check_cursor, utcnow
from preft_serve.registry.policy_schemas import VersionState
from preft_serve.registry.quotas import Quota, check_upload, tenant_use
from preft_serve.registry.schemas import AdapterDetail, AdapterOut, AdapterVersion, VersionOut
from preft_serve.registry.serving_policy import (
    CANARY_FIELD,
    LATEST_FIELD,
    VERSION_FIELDS,
    latest_version,
    queue_states,
    served_versions,
)
from preft_serve.registry.transfers import EXPORT_SLACK_BYTES, hold_scratch
from preft_serve.registry.txn import Redis, transact
from preft_serve.registry.user_index import queue_unindexed
from preft_serve.registry.validation import (
    BaseModelSpec,
    UploadBounds,
    ValidatedAdapter,
    validate_adapter,
)

logger = logging.getLogger(__name__)
_VERSION_FIELDS = VERSION_FIELDS
CONTENT_DELETE_WAIT_S = 30.0
"""The longest an upload waits for its content to finish being deleted as unreferenced
(a few store deletes) before it is refused with 503."""


class ContentBeingDeleted(Exception):
    """The version's content is being removed from the store as unreferenced."""


@dataclasses.dataclass(frozen=True)
class UploadResult:
    version: AdapterVersion
    created: bool  # False: identical to the current version, nothing changed
    warnings: tuple[str, ...] = ()  # validation's, for the upload response
    state: VersionState = VersionState.SERVING  # the version's state once committed
    replaced: AdapterVersion | None = None  # the version served before it was promoted

    def audit_change(self) -> tuple[str | None, str] | None:
        """(before, after) as the audit log states a committed new version: the served one
        it replaced, and itself (with its state when it does not serve); None when nothing
        new was stored. Shared by uploads and fine-tuning's registration."""
        if not self.created:
            return None
        before = version_id(self.replaced) if self.replaced is not None else None
        after = version_id(self.version)
        return before, after if self.state is VersionState.SERVING else f"{after} {self.state}"


def version_id(rec: AdapterVersion) -> str:
    """A version as audit entries name it: ``v<n>:<sha256>``."""
    return f"v{rec.version}:{rec.sha256}"


def version_record(name: str, v: ValidatedAdapter, version: int, now: str) -> AdapterVersion:
    return AdapterVersion(
        name=name,
        version=version,
        sha256=v.sha256,
        type=v.type,
        rank=v.rank,
        mode=v.mode,
        base_model=v.base_model,
        size_bytes=v.size_bytes,
        created_at=now,
    )


def queue_version(
    pipe: Any,
    keys: RegistryKeys,
    tenant: str,
    rec: AdapterVersion,
    adapter_created_at: str,
    maxlen: int,
) -> None:
    """Queue every write of a new version served to everyone, plus its event (shared with
    the bench). The caller retires what was served before (``serving_policy``)."""
    fields = _queue_record(pipe, keys, tenant, rec, VersionState.SERVING)
    pipe.hset(
        keys.adapter(tenant, rec.name),
        mapping={
            **fields,
            "name": rec.name,
            "adapter_created_at": adapter_created_at,
            "updated_at": rec.created_at,
            LATEST_FIELD: str(rec.version),
        },
    )
    pipe.hdel(keys.adapter(tenant, rec.name), CANARY_FIELD)
    pipe.zadd(keys.adapters(tenant), {rec.name: 0})
    queue_event(
        pipe,
        keys,
        RegistryEvent(
            EventType.ADAPTER_UPDATED.value,
            tenant,
            adapter=rec.name,
            version=rec.version,
            sha256=rec.sha256,
        ),
        maxlen,
    )


def _queue_record(
    pipe: Any,
    keys: RegistryKeys,
    tenant: str,
    rec: AdapterVersion,
    state: VersionState,
) -> dict[str, str]:
    """Queue a new version's history record and its blob record; its fields. The blob
    record is a few fixed fields: the config, which a tenant sizes, stays in the object
    store beside the weights (Redis memory is every tenant's)."""
    fields = {
        f: str(getattr(rec, f).value if f in ("type", "mode") else getattr(rec, f))
        for f in _VERSION_FIELDS
    }
    pipe.hset(
        keys.versions(tenant, rec.name),
        str(rec.version),
        json.dumps({**fields, "state": state.value}),
    )
    pipe.hset(
        keys.blob(rec.sha256),
        mapping={
            "sha256": rec.sha256,
            "type": fields["type"],
            "mode": fields["mode"],
            "rank": fields["rank"],
            "base_model": rec.base_model,
            "size_bytes": fields["size_bytes"],
        },
    )
    queue_reference(pipe, keys, rec.sha256)
    return fields


def _adapter_out(current: dict[str, str], bound: int) -> AdapterOut:
    return AdapterOut(
        name=current["name"],
        version=int(current["version"]),
        sha256=current["sha256"],
        type=AdapterType(current["type"]),
        rank=int(current["rank"]),
        mode=AdapterMode(current["mode"]),
        base_model=current["base_model"],
        size_bytes=int(current["size_bytes"]),
        created_at=current["adapter_created_at"],
        updated_at=current["updated_at"],
        bound_users=bound,
    )


class AdapterService:
    def __init__(
        self,
        client: Redis,
        keys: RegistryKeys,
        store: ObjectStore,
        base: BaseModelSpec,
        bounds: UploadBounds,
        staging_dir: Path | None,
        events_maxlen: int,
        quota: Quota | None = None,
        max_versions: int = 1000,
    ) -> None:
        self.redis = client
        self.max_versions = max_versions
        self.quota = quota
        self.keys = keys
        self.store = store
        self.base = base
        self.bounds = bounds
        self.staging_dir = staging_dir
        self.maxlen = events_maxlen
        # Deleted adapters' contents: collected at once until the app starts it (then in
        # its thread: a delete need not wait for the store).
        self.collector = ContentCollector(client, keys, store)

    def upload(
        self,
        tenant: str,
        name: str,
        mode: AdapterMode | None,
        files: list[UploadedFile],
        *,
        create: bool,
        strict: bool = False,
        promote: bool = True,
    ) -> UploadResult:
        """Validate, store and commit one adapter version.

        ``create=True`` (POST) refuses to add a version to an existing name unless the
        content is identical; ``create=False`` (PUT) adds a version or
        creates the adapter. ``mode=None`` keeps the current version's mode. ``strict``
        refuses what would otherwise be accepted with warnings. ``promote=False`` stores
        the version as ``staged``: users keep the served one until a policy names it (a
        new adapter's first version is served either way: there is nothing else to serve).
        """
        check_adapter_name(name)
        if mode is None:
            current_mode = self.redis.hget(self.keys.adapter(tenant, name), "mode")
            if current_mode is None:
                raise InvalidRequest(
                    f"field 'mode' is required for a new adapter: "
                    f"{' or '.join(m.value for m in AdapterMode)}"
                )
            mode = AdapterMode(current_mode)
        with tempfile.TemporaryDirectory(dir=self.staging_dir, prefix="preft-upload-") as tmp:
            staged = stage_upload(files, Path(tmp), self.bounds)
            validated = validate_adapter(
                staged.config_path, staged.weights_path, mode, self.base, self.bounds, strict=strict
            )
            # Decide no-op / conflict before writing a blob nobody would reference.
            current = self.redis.hgetall(self.keys.adapter(tenant, name))
            early = self._unchanged_or_conflict(name, current, validated, create)
            if early is not None:
                return dataclasses.replace(early, warnings=validated.warnings)
            if current:
                self.check_version_room(tenant, name)
            if self.quota is not None:
                check_upload(
                    self.quota,
                    tenant_use(self.redis, self.keys, tenant),
                    tenant,
                    new_adapter=not current,
                    sha256=validated.sha256,
                    size_bytes=validated.size_bytes,
                )
            committed = self._store_and_commit(tenant, name, validated, create, promote)
        result = dataclasses.replace(committed, warnings=validated.warnings)
        if result.created:
            logger.info(
                "tenant %s adapter %s version %d (%s) -> %s (%s, %s, rank %d)",
                tenant,
                name,
                result.version.version,
                result.state.value,
                result.version.sha256,
                validated.type.value,
                validated.mode.value,
                validated.rank,
            )
        return result

    def _store_and_commit(
        self, tenant: str, name: str, v: ValidatedAdapter, create: bool, promote: bool
    ) -> UploadResult:
        """Store the content (unless the store has it) and commit the version; while the
        content is being deleted as unreferenced (``blob_gc``), wait for the delete to end
        and store it again, for at most :data:`CONTENT_DELETE_WAIT_S`."""
        deadline = time.monotonic() + CONTENT_DELETE_WAIT_S
        while True:
            stored_at = epoch_to_store(self.redis, self.keys, v.sha256, deadline)
            self.store.put_adapter(v.sha256, v.config_bytes, v.weights_path, verify=False)
            try:
                return self.commit(
                    tenant, name, v, create=create, promote=promote, stored_at=stored_at
                )
            except (QuotaExceeded, Conflict):
                # Refused after the content was stored (another writer got there first):
                # collected unless some version references it (``blob_gc``).
                self.collector.submit({v.sha256})
                raise
            except ContentBeingDeleted:  # a delete began after the epoch was read
                if time.monotonic() > deadline:
                    raise Unavailable(
                        "this adapter's content keeps being removed from the store as "
                        "unreferenced; retry the upload shortly"
                    ) from None

    @staticmethod
    def _unchanged_or_conflict(
        name: str, current: dict[str, str], v: ValidatedAdapter, create: bool
    ) -> UploadResult | None:
        if current and current["sha256"] == v.sha256:
            return UploadResult(
                AdapterVersion.model_validate(
                    {"name": name, **{f: current[f] for f in _VERSION_FIELDS}}
                ),
                created=False,
            )
        if current and create:
            raise Conflict(
                f"adapter {shown(name)} already exists (version {current['version']}); "
                f"upload a new version with PUT /v1/adapters/{name}"
            )
        return None

    def commit(
        self,
        tenant: str,
        name: str,
        v: ValidatedAdapter,
        *,
        create: bool,
        promote: bool = True,
        stored_at: str | None,
    ) -> UploadResult:
        """Point ``name`` at stored content ``v`` as its next version (atomic), served
        (``promote``) or staged.

        Re-checks under WATCH what ``upload`` pre-checked, since another writer may have
        committed in between. Every writer of the history also writes the adapter's hash,
        so watching the hash is enough. ``stored_at`` is the content's delete epoch read
        before it was stored (``blob_gc.epoch_to_store``; ``None``: no delete yet): a
        delete of the content since then raises :class:`ContentBeingDeleted`.
        """
        adapter_key = self.keys.adapter(tenant, name)

        def txn(pipe: Any) -> UploadResult:
            current = pipe.hgetall(adapter_key)
            now = utcnow()
            early = self._unchanged_or_conflict(name, current, v, create)
            if early is not None:
                return early
            if not stored_since(pipe, self.keys, v.sha256, stored_at):
                raise ContentBeingDeleted(v.sha256)
            records = pipe.hgetall(self.keys.versions(tenant, name)) if current else {}
            self._check_room(name, len(records))
            rec = version_record(name, v, latest_version(current) + 1 if current else 1, now)
            pipe.multi()
            if promote or not current:
                return self._queue_promoted(pipe, tenant, rec, current, records)
            _queue_record(pipe, self.keys, tenant, rec, VersionState.STAGED)
            pipe.hset(adapter_key, LATEST_FIELD, str(rec.version))
            return UploadResult(rec, created=True, state=VersionState.STAGED)

        return transact(self.redis, txn, adapter_key, *watched_keys(self.keys, v.sha256))

    def check_version_room(self, tenant: str, name: str) -> None:
        """Refuse, before anything is stored or trained, a new version of an adapter that
        has as many as it may keep (the commit checks again under WATCH)."""
        self._check_room(name, int(self.redis.hlen(self.keys.versions(tenant, name))))

    def _check_room(self, name: str, versions: int) -> None:
        """Refuse a version past ``max_versions``: every upload, rollback or fine-tuned
        version is a record in Redis (and each upload reads them all), so a tenant
        re-uploading two contents in turn must not grow one adapter's history without
        bound."""
        if versions >= self.max_versions:
            raise QuotaExceeded(
                f"adapter {shown(name)} already has {versions} versions, the most one "
                f"adapter keeps (PREFT_REGISTRY_MAX_VERSIONS_PER_ADAPTER); upload under a new "
                f"adapter name, or delete this adapter and upload it again",
                param="name",
            )

    def _queue_promoted(
        self,
        pipe: Any,
        tenant: str,
        rec: AdapterVersion,
        current: dict[str, str],
        records: dict[str, str],
    ) -> UploadResult:
        """Queue ``rec`` as the version everyone gets (any canary ends), retiring what was
        served; pipe in MULTI mode, ``current`` and ``records`` read before."""
        now = rec.created_at
        queue_version(
            pipe,
            self.keys,
            tenant,
            rec,
            current.get("adapter_created_at", now),
            self.maxlen,
        )
        if not current:
            return UploadResult(rec, created=True)
        queue_states(
            pipe,
            self.keys.versions(tenant, rec.name),
            {int(k): json.loads(r) for k, r in records.items()},
            served_versions(current),
            {rec.version},
        )
        replaced = AdapterVersion.model_validate(
            {"name": rec.name, **{f: current[f] for f in _VERSION_FIELDS}}
        )
        return UploadResult(rec, created=True, replaced=replaced)

    def list(
        self, tenant: str, limit: int, cursor: str | None
    ) -> tuple[list[AdapterOut], str | None]:
        """One page of adapters by name; the cursor is the last name of the previous page."""
        if cursor is not None:
            check_cursor(cursor)
        start = f"({cursor}" if cursor else "-"
        names = self.redis.zrangebylex(self.keys.adapters(tenant), start, "+", 0, limit + 1)
        page, more = names[:limit], len(names) > limit
        pipe = self.redis.pipeline(transaction=False)
        for name in page:
            pipe.hgetall(self.keys.adapter(tenant, name))
            pipe.scard(self.keys.adapter_users(tenant, name))
        results = pipe.execute()
        items = [_adapter_out(cur, bound) for cur, bound in zip(results[::2], results[1::2]) if cur]
        return items, (page[-1] if more and page else None)

    def get(self, tenant: str, name: str) -> AdapterDetail:
        check_adapter_name(name)
        pipe = self.redis.pipeline(transaction=True)  # one consistent snapshot
        pipe.hgetall(self.keys.adapter(tenant, name))
        pipe.scard(self.keys.adapter_users(tenant, name))
        pipe.hvals(self.keys.versions(tenant, name))
        current, bound, versions = pipe.execute()
        if not current:
            raise NotFound(f"adapter {shown(name)} does not exist")
        history = sorted((VersionOut(**json.loads(v)) for v in versions), key=lambda v: v.version)
        return AdapterDetail(**_adapter_out(current, bound).model_dump(), versions=history)

    def delete(self, tenant: str, name: str, *, force: bool) -> int:
        """Delete an adapter and its history; returns how many users were unbound.

        Bound users make this a 409 unless ``force``: silently sending users to the base
        model is a decision the tenant should make explicitly. Its contents are deleted
        from the store afterwards, in the collector's thread, unless another version of
        any adapter references them (``blob_gc``).
        """
        check_adapter_name(name)
        k = self.keys
        users_key, count_key = k.adapter_users(tenant, name), k.bound_users(tenant)

        digests: set[str] = set()

        def txn(pipe: Any) -> int:
            if not pipe.exists(k.adapter(tenant, name)):
                raise NotFound(f"adapter {shown(name)} does not exist")
            digests.clear()
            digests.update(json.loads(r)["sha256"] for r in pipe.hvals(k.versions(tenant, name)))
            users = sorted(pipe.smembers(users_key))
            if users and not force:
                raise Conflict(
                    f"adapter {shown(name)} is bound to {len(users)} user(s); unbind "
                    "them first or delete with ?force=true, which also unbinds them"
                )
            bound = int(pipe.get(count_key) or 0) if users else 0
            pipe.multi()
            uncount_users(pipe, count_key, bound, len(users))
            pipe.delete(k.adapter(tenant, name), k.versions(tenant, name), users_key)
            queue_unindexed(pipe, k, tenant, *users)
            pipe.zrem(k.adapters(tenant), name)
            for user in users:
                pipe.delete(k.binding(tenant, user))
                queue_event(
                    pipe,
                    k,
                    RegistryEvent(EventType.BINDING_DELETED.value, tenant, adapter=name, user=user),
                    self.maxlen,
                )
            queue_event(
                pipe,
                k,
                RegistryEvent(EventType.ADAPTER_DELETED.value, tenant, adapter=name),
                self.maxlen,
            )
            return len(users)

        unbound = transact(self.redis, txn, k.adapter(tenant, name), users_key, count_key)
        self.collector.submit(digests)
        logger.info("tenant %s deleted adapter %s (%d users unbound)", tenant, name, unbound)
        return unbound

    def version(self, tenant: str, name: str, version: int | None) -> AdapterVersion:
        """One version's record (``None``: the current one); 404 names what exists."""
        check_adapter_name(name)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hgetall(self.keys.adapter(tenant, name))
        pipe.hget(self.keys.versions(tenant, name), str(version or 0))
        current, raw = pipe.execute()
        if not current:
            raise NotFound(f"adapter {shown(name)} does not exist")
        if version is None:
            fields = {f: current[f] for f in _VERSION_FIELDS}
        elif raw is None:
            raise NotFound(
                f"adapter {shown(name)} has no version {version}; its versions are "
                f"1 to {latest_version(current)}"
            )
        else:
            fields = json.loads(raw)
        return AdapterVersion.model_validate({"name": name, **fields})

    def export(
        self, tenant: str, name: str, version: int | None, dest_dir: Path
    ) -> tuple[AdapterVersion, Path]:
        """Write one version's stored files as ``<name>-v<version>.tar.gz`` into ``dest_dir``.

        The two files sit at the archive's root, byte for byte as stored (the download is
        verified against the digest first), so uploading the archive or its extracted folder
        again yields the same sha256.
        """
        rec = self.version(tenant, name, version)
        folder = dest_dir / "files"
        # Counted before they are written: the files, then their archive.
        hold_scratch(rec.size_bytes + EXPORT_SLACK_BYTES)
        try:
            self.store.fetch_adapter(rec.sha256, folder)
        except ObjectNotFound:
            raise NotFound(
                f"the content of adapter {shown(name)} version {rec.version} is no "
                "longer in the object store"
            ) from None
        archive = dest_dir / f"{name}-v{rec.version}.tar.gz"
        hold_scratch(rec.size_bytes + EXPORT_SLACK_BYTES)
        with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
            for filename in (CONFIG_FILE, WEIGHTS_FILE):
                tar.add(folder / filename, arcname=filename, filter=_anonymous)
        return rec, archive

    def rollback(self, tenant: str, name: str, version: int) -> UploadResult:
        """Make version ``version``'s content current again, as the next version.

        History stays append-only: the rollback is a new version pointing at the old
        content (same sha256, so workers that still cache it load nothing), committed and
        announced exactly like an upload (``adapter.updated``). Already current: no-op.
        """
        check_adapter_name(name)
        k = self.keys
        adapter_key = k.adapter(tenant, name)
        target = self.version(tenant, name, version)
        if not self.store.has_adapter(target.sha256):
            raise NotFound(
                f"the content of adapter {shown(name)} version {version} is no "
                "longer in the object store; upload it again"
            )

        def txn(pipe: Any) -> UploadResult:
            current = pipe.hgetall(adapter_key)
            if not current:
                raise NotFound(f"adapter {shown(name)} does not exist")
            if current["sha256"] == target.sha256:
                return UploadResult(
                    AdapterVersion.model_validate(
                        {"name": name, **{f: current[f] for f in _VERSION_FIELDS}}
                    ),
                    created=False,
                )
            records = pipe.hgetall(k.versions(tenant, name))
            recorded = records.get(str(target.version))
            if recorded is None or json.loads(recorded)["sha256"] != target.sha256:
                raise NotFound(  # deleted and created again since ``target`` was read
                    f"adapter {shown(name)} has no version {target.version} with that "
                    "content any more; read its versions again"
                )
            self._check_room(name, len(records))
            if not pipe.exists(k.blob(target.sha256)):
                raise NotFound(
                    f"the content of adapter {shown(name)} version {version} is no "
                    "longer registered; upload it again"
                )
            rec = target.model_copy(
                update={"version": latest_version(current) + 1, "created_at": utcnow()}
            )
            pipe.multi()
            return self._queue_promoted(pipe, tenant, rec, current, records)

        # The blob record is watched too: a collector unlinking the content (``blob_gc``)
        # between the check and EXEC makes this run again and find it gone.
        result = transact(
            self.redis, txn, adapter_key, k.versions(tenant, name), k.blob(target.sha256)
        )
        if result.created:
            logger.info(
                "tenant %s adapter %s rolled back to version %d's content as version %d (%s)",
                tenant,
                name,
                version,
                result.version.version,
                result.version.sha256,
            )
        return result


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Archive members without the server's owner, group or file mode."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o644
    return info
