"""Tenants and their API keys (the keys' records and rules: ``api_keys``).

Several keys may be live at once, which is how rotation works: create a new key, switch
clients, revoke the old one.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import json
import logging
import time
from typing import Any

import redis

from preft_serve.common.domain_errors import Conflict, NotFound, Unauthenticated
from preft_serve.common.key_roles import DEFAULT_ROLE, KeyRole
from preft_serve.common.objectstore import ObjectStore
from preft_serve.common.registry_client import (
    API_KEY_PREFIX,
    USAGE_TTL_S,
    EventType,
    KeyOwner,
    RegistryEvent,
    RegistryKeys,
    hash_api_key,
)
from preft_serve.common.registry_client.cache import KEY_USE_INTERVAL_S
from preft_serve.common.tenant_rate_limits import TenantRateLimits
from preft_serve.common.tenant_serving import UNBOUND_USER_FIELD, parse_unbound_user
from preft_serve.common.text import shown
from preft_serve.registry.api_keys import KeySpec, key_info, live_admins, queue_key
from preft_serve.registry.audit import OPERATOR
from preft_serve.registry.events import queue_event
from preft_serve.registry.names import check_key_id, check_tenant_name, utcnow
from preft_serve.registry.quotas import (
    RECORD_FIELDS,
    QuotaOverrides,
    overrides_from_record,
    record_changes,
)
from preft_serve.registry.schemas import (
    ApiKeyCreated,
    ApiKeyInfo,
    TenantDeleted,
    TenantOut,
    TenantSummary,
    TenantUpdate,
)
from preft_serve.registry.tenant_delete import delete_tenant
from preft_serve.registry.txn import Redis, transact

logger = logging.getLogger(__name__)


KEY_USE_ENTRIES = 20_000  # key ids whose last write time a registry process remembers


@dataclasses.dataclass(frozen=True)
class Principal:
    """The authenticated caller of a tenant endpoint."""

    tenant: str
    key_id: str
    role: KeyRole = DEFAULT_ROLE


class TenantService:
    def __init__(
        self,
        client: Redis,
        keys: RegistryKeys,
        events_maxlen: int,
        store: ObjectStore | None = None,
    ) -> None:
        self.redis = client
        self.keys = keys
        self.maxlen = events_maxlen
        self.store = store  # for delete(): blobs only the deleted tenant referenced
        self._key_use: dict[str, float] = {}  # key id -> monotonic time of its last write

    def _queue_key(self, pipe: Any, tenant: str, spec: KeySpec, created_by: str) -> ApiKeyCreated:
        return queue_key(pipe, self.keys, self.maxlen, tenant, spec, created_by, utcnow())

    def create(
        self, name: str, quota: QuotaOverrides | None = None
    ) -> tuple[TenantOut, ApiKeyCreated]:
        """Create a tenant with its first API key (409 if the name is taken), with its own
        storage quotas where ``quota`` sets them."""
        check_tenant_name(name)
        created_at = utcnow()
        quota = quota or QuotaOverrides()
        stored, _ = record_changes(quota, set(quota.model_fields_set))

        def txn(pipe: Any) -> ApiKeyCreated:
            if pipe.exists(self.keys.tenant(name)):
                raise Conflict(
                    f"tenant {shown(name)} already exists; choose another name or issue "
                    f"a new key with POST /v1/tenants/{name}/keys"
                )
            pipe.multi()
            pipe.hset(
                self.keys.tenant(name), mapping={"name": name, "created_at": created_at, **stored}
            )
            pipe.sadd(self.keys.tenants, name)
            queue_event(
                pipe, self.keys, RegistryEvent(EventType.TENANT_CREATED.value, name), self.maxlen
            )
            return self._queue_key(pipe, name, KeySpec(), OPERATOR)

        key = transact(self.redis, txn, self.keys.tenant(name))
        logger.info("created tenant %s with key %s", name, key.key_id)
        tenant = TenantOut(
            name=name,
            created_at=created_at,
            keys=[ApiKeyInfo(**key.model_dump(exclude={"tenant", "api_key"}))],
            quota=overrides_from_record(stored),
        )
        return tenant, key

    def get(self, name: str) -> TenantOut:
        check_tenant_name(name)
        info = self.redis.hgetall(self.keys.tenant(name))
        if not info:
            raise NotFound(f"tenant {shown(name)} does not exist")
        return TenantOut(
            name=name,
            created_at=info["created_at"],
            keys=self.list_keys(name),
            quota=overrides_from_record(info),
            unbound_user=parse_unbound_user(info.get(UNBOUND_USER_FIELD)),
        )

    def update(self, name: str, patch: TenantUpdate) -> TenantOut:
        """Apply a merge patch to the tenant's settings: in ``quota`` a value sets the
        tenant's own limit, null removes it (``"quota": null`` removes every override; the
        next upload is checked against the result); ``unbound_user`` null goes back to the
        default. Fields the patch leaves out are unchanged."""
        check_tenant_name(name)
        stored: dict[str, str] = {}
        removed: list[str] = []
        if "quota" in patch.model_fields_set:
            quota = patch.quota
            fields = set(quota.model_fields_set) if quota is not None else set()
            if quota is None:
                quota, fields = QuotaOverrides(), set(QuotaOverrides.model_fields)
            stored, removed = record_changes(quota, fields)
        if "unbound_user" in patch.model_fields_set:
            if patch.unbound_user is None:
                removed = [*removed, UNBOUND_USER_FIELD]
            else:
                stored = {**stored, UNBOUND_USER_FIELD: patch.unbound_user.value}
        key = self.keys.tenant(name)

        def txn(pipe: Any) -> None:
            if not pipe.exists(key):
                raise NotFound(f"tenant {shown(name)} does not exist")
            pipe.multi()
            if stored:
                pipe.hset(key, mapping=stored)
            if removed:
                pipe.hdel(key, *removed)

        transact(self.redis, txn, key)
        tenant = self.get(name)
        logger.info(
            "tenant %s quota overrides: %s, unbound users: %s",
            name,
            tenant.quota.model_dump(),
            tenant.unbound_user.value,
        )
        return tenant

    def list_tenants(
        self, limit: int, after: str | None = None
    ) -> tuple[list[TenantSummary], str | None]:
        """Up to ``limit`` tenants by name after ``after``, each with its adapter count and
        quota overrides, and the name to continue after (None: this was the last page)."""
        names = sorted(self.redis.smembers(self.keys.tenants))
        if after is not None:
            names = names[bisect.bisect_right(names, after) :]
        more = len(names) > limit
        names = names[:limit]
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.hmget(self.keys.tenant(name), ["created_at", *RECORD_FIELDS])
            pipe.zcard(self.keys.adapters(name))
        found = pipe.execute()
        page = [
            TenantSummary(
                name=n,
                created_at=record[0],
                adapters=count,
                quota=overrides_from_record(record[1:]),
            )
            for n, record, count in zip(names, found[::2], found[1::2])
            if record[0]
        ]
        return page, (names[-1] if more else None)

    def delete(self, tenant: str) -> TenantDeleted:
        """Delete the tenant with its keys, bindings, adapters and unshared blobs."""
        if self.store is None:
            raise RuntimeError("TenantService.delete needs the object store")
        keys, adapters, bindings, blobs, files, jobs = delete_tenant(
            self.redis, self.keys, self.store, tenant, self.maxlen
        )
        return TenantDeleted(
            name=tenant,
            keys=keys,
            adapters=adapters,
            bindings=bindings,
            blobs=blobs,
            files=files,
            fine_tuning_jobs=jobs,
        )

    def get_rate_limits(self, tenant: str) -> TenantRateLimits:
        self.get(tenant)
        return TenantRateLimits.model_validate_strings(
            self.redis.hgetall(self.keys.tenant_rate_limits(tenant))
        )

    def set_rate_limits(self, tenant: str, limits: TenantRateLimits) -> TenantRateLimits:
        """Replace the overrides (gateways pick them up within their limits cache TTL)."""
        self.get(tenant)
        values = {k: str(v) for k, v in limits.model_dump().items() if v is not None}
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.tenant_rate_limits(tenant))
        if values:
            pipe.hset(self.keys.tenant_rate_limits(tenant), mapping=values)
        pipe.execute()
        return limits

    def list_keys(self, tenant: str) -> list[ApiKeyInfo]:
        """The tenant's keys, oldest first, with their last use (never secrets or hashes)."""
        check_tenant_name(tenant)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hvals(self.keys.tenant_keys(tenant))
        pipe.hgetall(self.keys.key_use(tenant))
        raw, used = pipe.execute()
        records = [json.loads(v) for v in raw]
        return sorted(
            (key_info(r, used.get(r["key_id"])) for r in records), key=lambda k: k.created_at
        )

    def get_key(self, tenant: str, key_id: str) -> ApiKeyInfo:
        check_tenant_name(tenant)
        check_key_id(key_id)
        raw = self.redis.hget(self.keys.tenant_keys(tenant), key_id)
        if raw is None:
            raise NotFound(f"tenant {shown(tenant)} has no key {shown(key_id)}")
        return key_info(json.loads(raw), self.redis.hget(self.keys.key_use(tenant), key_id))

    def create_key(
        self,
        tenant: str,
        spec: KeySpec | None = None,
        created_by: str = OPERATOR,
        max_keys: int | None = None,
    ) -> ApiKeyCreated:
        """Issue an additional key (rotation step 1); existing keys stay valid. Without a
        ``spec``: an admin key that does not expire. ``max_keys``: refuse (409) when the
        tenant already holds that many keys (expired ones included; revoked ones are
        deleted). The count is read under WATCH of the tenant's key hash, so two concurrent
        creations cannot both pass it."""
        check_tenant_name(tenant)
        keys_key = self.keys.tenant_keys(tenant)

        def txn(pipe: Any) -> ApiKeyCreated:
            if not pipe.exists(self.keys.tenant(tenant)):
                raise NotFound(f"tenant {shown(tenant)} does not exist")
            if max_keys is not None and (held := int(pipe.hlen(keys_key))) >= max_keys:
                raise Conflict(
                    f"tenant {shown(tenant)} holds {held} API keys, the most it may hold "
                    f"({max_keys}): revoke keys it no longer uses, expired ones first "
                    "(GET /v1/keys lists them, DELETE /v1/keys/{key_id} revokes one), "
                    "then create this one",
                    code="key_limit_reached",
                )
            pipe.multi()
            return self._queue_key(pipe, tenant, spec or KeySpec(), created_by)

        created = transact(self.redis, txn, self.keys.tenant(tenant), keys_key)
        logger.info(
            "created %s key %s of tenant %s (by %s)",
            created.role,
            created.key_id,
            tenant,
            created_by,
        )
        return created

    def revoke_key(self, tenant: str, key_id: str, keep_admin: bool = False) -> ApiKeyInfo:
        """Revoke one key; requests with it fail from the next call on (gateways drop it
        from their caches on the ``apikey.revoked`` event). ``keep_admin``: refuse (409)
        to revoke the tenant's last unexpired admin key, so a tenant cannot lock itself
        out (the operator's routes pass False: the operator can always issue a new one)."""
        check_tenant_name(tenant)
        check_key_id(key_id)
        keys_key = self.keys.tenant_keys(tenant)

        def txn(pipe: Any) -> ApiKeyInfo:
            raw = pipe.hget(keys_key, key_id)
            if raw is None:
                raise NotFound(f"tenant {shown(tenant)} has no key {shown(key_id)}")
            record = json.loads(raw)
            if keep_admin:
                others = [json.loads(v) for k, v in pipe.hgetall(keys_key).items() if k != key_id]
                now = dt.datetime.now(dt.UTC)
                if key_id in live_admins([record], now) and not live_admins(others, now):
                    raise Conflict(
                        f"key {shown(key_id)} is tenant {shown(tenant)}'s last admin key: "
                        "create another admin key first (POST /v1/keys with role admin), "
                        "then revoke this one",
                        code="last_admin_key",
                    )
            pipe.multi()
            pipe.hdel(keys_key, key_id)
            pipe.hdel(self.keys.key_use(tenant), key_id)
            pipe.delete(self.keys.api_key(record["hash"]))
            queue_event(
                pipe,
                self.keys,
                RegistryEvent(EventType.API_KEY_REVOKED.value, tenant, key_id=key_id),
                self.maxlen,
            )
            return key_info(record, None)

        revoked = transact(self.redis, txn, keys_key)
        logger.info("revoked key %s of tenant %s", key_id, tenant)
        return revoked

    def authenticate(self, api_key: str) -> Principal:
        if not api_key.startswith(API_KEY_PREFIX):
            raise Unauthenticated(
                "not a preft API key (they start with 'pft_'); send "
                "'Authorization: Bearer <API key>'"
            )
        found = self.redis.hgetall(self.keys.api_key(hash_api_key(api_key)))
        if not found:
            raise Unauthenticated("invalid or revoked API key")
        owner = KeyOwner.from_fields(found)
        if owner.expired(time.time()):
            when = dt.datetime.fromtimestamp(owner.expires, dt.UTC).isoformat(timespec="seconds")
            raise Unauthenticated(
                f"API key {owner.key_id} expired at {when}; use another key, or ask an admin "
                "of your tenant for a new one",
                code="expired_api_key",
            )
        return Principal(owner.tenant, owner.key_id, owner.role)

    def record_use(self, principal: Principal) -> None:
        """Write when the key was last used, at most once a minute per key (per process).
        Bookkeeping only: a Redis error here is logged, never raised."""
        now = time.monotonic()
        last = self._key_use.get(principal.key_id)
        if last is not None and now - last < KEY_USE_INTERVAL_S:
            return
        if len(self._key_use) >= KEY_USE_ENTRIES:
            self._key_use.clear()
        self._key_use[principal.key_id] = now
        key = self.keys.key_use(principal.tenant)
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hset(key, principal.key_id, utcnow())
            pipe.expire(key, USAGE_TTL_S)
            pipe.execute()
        except redis.RedisError as exc:
            logger.warning("could not record the use of key %s: %s", principal.key_id, exc)
