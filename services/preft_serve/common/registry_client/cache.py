"""The client cache and the state and event handling shared by the sync and async clients."""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import redis

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.common.registry_client.contract import (
    ADAPTER_FIELDS,
    AdapterRef,
    BlobInfo,
    EventType,
    KeyOwner,
    RegistryEvent,
    RegistryKeys,
    is_adapter_name,
    is_tenant_name,
    is_user_id,
    stream_id_key,
)

logger = logging.getLogger(__name__)

# One round trip: binding -> adapter name -> current version fields.
RESOLVE_USER_LUA = (
    "local name = redis.call('GET', KEYS[1])\n"
    "if not name then return false end\n"
    "local f = redis.call('HMGET', ARGV[1] .. name, "
    + ", ".join(f"'{f}'" for f in ADAPTER_FIELDS)
    + ")\nreturn {name, unpack(f)}\n"
)

MISSING: Any = object()
# Entries per cache map (users, adapters, API keys). A worst-case entry (256-character ids,
# an adapter ref) is under 1 KiB, so the three maps stay within ~35 MiB; at the former
# 1,000,000 the two maps of negative answers alone could take ~1 GiB.
DEFAULT_MAX_ENTRIES = 20_000
# The event listener retries a lost Redis after 0.5 s, doubling up to 5 s.
LISTENER_RETRY_FIRST_S = 0.5
LISTENER_RETRY_MAX_S = 5.0
# A key's last use is written at most this often per key (per process).
KEY_USE_INTERVAL_S = 60.0
# Redis itself is unreachable (as opposed to a bad command): lookups may fall back to the cache.
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError)
Listener = Callable[[RegistryEvent], None]


def valid_user(tenant: str, user: str) -> bool:
    """Whether a binding key can be built for these (else no binding can exist)."""
    return is_tenant_name(tenant) and is_user_id(user)


def valid_adapter(tenant: str, name: str) -> bool:
    """Whether an adapter key can be built for these (else no such adapter can exist)."""
    return is_tenant_name(tenant) and is_adapter_name(name)


def parse_ref(tenant: str, name: str, values: list[Any]) -> AdapterRef | None:
    if not values or values[0] is None:
        return None
    version, sha256, type_, mode, rank, base_model, created_at, canary = values
    created = unix_seconds(created_at)
    return AdapterRef(
        tenant,
        name,
        int(version),
        str(sha256),
        AdapterType(type_),
        AdapterMode(mode),
        int(rank or 0),
        str(base_model or ""),
        created,
        *(parse_canary(tenant, name, canary, created) if canary else (None, 0.0)),
    )


def parse_canary(tenant: str, name: str, raw: str, created: int) -> tuple[AdapterRef | None, float]:
    """The adapter hash's ``canary`` field (JSON, written by the registry's serving policy)
    as (the canary version's ref, its weight)."""
    f = json.loads(raw)
    ref = AdapterRef(
        tenant,
        name,
        int(f["version"]),
        str(f["sha256"]),
        AdapterType(f["type"]),
        AdapterMode(f["mode"]),
        int(f.get("rank") or 0),
        str(f.get("base_model") or ""),
        created,
    )
    return ref, float(f["weight"])


def parse_version(tenant: str, name: str, raw: str, created_at: str | None) -> AdapterRef:
    """A version history entry (the registry's JSON of the version's fields)."""
    f = json.loads(raw)
    return AdapterRef(
        tenant,
        name,
        int(f["version"]),
        str(f["sha256"]),
        AdapterType(f["type"]),
        AdapterMode(f["mode"]),
        int(f.get("rank") or 0),
        str(f.get("base_model") or ""),
        unix_seconds(created_at),
    )


def unix_seconds(iso: str | None) -> int:
    """Whole seconds since the epoch of an ISO 8601 timestamp (0: missing or unreadable)."""
    if not iso:
        return 0
    try:
        stamp = dt.datetime.fromisoformat(str(iso))
    except ValueError:
        return 0
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return int(stamp.timestamp())


def parse_blob(fields: Mapping[str, str]) -> BlobInfo | None:
    if not fields:
        return None
    return BlobInfo(
        sha256=fields["sha256"],
        type=AdapterType(fields["type"]),
        mode=AdapterMode(fields["mode"]),
        rank=int(fields["rank"]),
        base_model=fields.get("base_model", ""),
        size_bytes=int(fields.get("size_bytes", 0)),
    )


class ResolveCache:
    """user -> adapter name and adapter -> ref maps, invalidated by events; no I/O.

    Reads are lock-free dict lookups; writes take a lock and are dropped when an event was
    applied since the caller's read began (``epoch`` changed), so a stale value fetched
    just before an invalidation is never stored after it.
    """

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.users: OrderedDict[tuple[str, str], str | None] = OrderedDict()
        self.adapters: OrderedDict[tuple[str, str], AdapterRef | None] = OrderedDict()
        self.blobs: dict[str, BlobInfo] = {}
        self.api_keys: OrderedDict[str, KeyOwner] = OrderedDict()  # valid keys only
        self.epoch = 0
        self.lock = threading.Lock()

    def get_user(self, tenant: str, user: str) -> Any:
        name = self.users.get((tenant, user), MISSING)
        if name is MISSING or name is None:
            return name
        return self.adapters.get((tenant, name), MISSING)

    def put(
        self, epoch: int, tenant: str, user: str | None, name: str | None, ref: AdapterRef | None
    ) -> None:
        with self.lock:
            if epoch != self.epoch:
                return
            if user is not None:
                self._put(self.users, (tenant, user), name)
            if name is not None:
                self._put(self.adapters, (tenant, name), ref)

    def _put(self, table: OrderedDict, key: Any, value: Any) -> None:  # type: ignore[type-arg]
        table[key] = value
        if len(table) > self.max_entries:
            table.popitem(last=False)

    def apply(self, event: RegistryEvent) -> None:
        with self.lock:
            self.epoch += 1
            if event.type in (EventType.ADAPTER_UPDATED, EventType.ADAPTER_DELETED):
                self.adapters.pop((event.tenant, event.adapter or ""), None)
            elif event.type in (EventType.BINDING_UPDATED, EventType.BINDING_DELETED):
                self.users.pop((event.tenant, event.user or ""), None)
            elif event.type == EventType.API_KEY_REVOKED:
                revoked = (event.tenant, event.key_id or "")
                for digest in [
                    d
                    for d, owner in self.api_keys.items()
                    if (owner.tenant, owner.key_id) == revoked
                ]:
                    del self.api_keys[digest]
            elif event.type not in {e.value for e in EventType}:
                self._clear()  # unknown kind of change: forget everything

    def put_key(self, epoch: int, digest: str, owner: KeyOwner) -> None:
        with self.lock:
            if epoch == self.epoch:
                self._put(self.api_keys, digest, owner)

    def sizes(self) -> dict[str, int]:
        """Entries per map (``blobs`` is not bounded: immutable content, few per adapter)."""
        return {
            "users": len(self.users),
            "adapters": len(self.adapters),
            "api_keys": len(self.api_keys),
            "blobs": len(self.blobs),
        }

    def _clear(self) -> None:
        self.users.clear()
        self.adapters.clear()
        self.api_keys.clear()

    def clear(self) -> None:
        with self.lock:
            self.epoch += 1
            self._clear()


class ClientBase:
    """State and event handling shared by the sync and async clients."""

    def __init__(
        self, namespace: str, cache: bool, max_cache_entries: int, cursor: str | None
    ) -> None:
        self.keys = RegistryKeys(namespace)
        self._use_cache = cache
        self._cache = ResolveCache(max_cache_entries)
        self._listeners: list[Listener] = []
        self._cursor: str | None = cursor
        self._live = False
        self._stale_logged = False
        self._retry_s = 0.0  # the listener's current back-off; 0 while connected
        self._key_use: dict[str, float] = {}  # key id -> monotonic time its use was written

    @property
    def live(self) -> bool:
        """Subscribed and caught up: cached answers are current."""
        return self._live

    @property
    def cursor(self) -> str | None:
        """Id of the last event applied (pass it to ``changes_since`` after a restart)."""
        return self._cursor

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(event)`` after each event is applied; it must not block."""
        self._listeners.append(listener)

    def cache_sizes(self) -> dict[str, int]:
        """Entries in each cache map (for metrics)."""
        return self._cache.sizes()

    def _listener_lost(self, exc: BaseException) -> float:
        """Seconds the listener waits before its next attempt: exponential back-off, with
        a warning when Redis goes away and debug lines while it stays away."""
        self._live = False
        if self._retry_s == 0.0:
            self._retry_s = LISTENER_RETRY_FIRST_S
            logger.warning(
                "registry event listener lost Redis (%s); retrying every %g-%g s until it is back",
                exc,
                LISTENER_RETRY_FIRST_S,
                LISTENER_RETRY_MAX_S,
            )
        else:
            self._retry_s = min(2 * self._retry_s, LISTENER_RETRY_MAX_S)
        logger.debug(
            "registry event listener: Redis unreachable (%s); next attempt in %g s",
            exc,
            self._retry_s,
        )
        return self._retry_s

    def _listener_back(self) -> None:
        if self._retry_s:
            logger.info("registry event listener reconnected to Redis and caught up")
        self._retry_s = 0.0

    def _cached_user(self, tenant: str, user: str) -> Any:
        return self._cache.get_user(tenant, user) if self._live and self._use_cache else MISSING

    def _cached_key(self, digest: str) -> Any:
        if not (self._live and self._use_cache):
            return MISSING
        return self._cache.api_keys.get(digest, MISSING)

    def _store_key(self, epoch: int, digest: str, fields: Mapping[str, str]) -> KeyOwner | None:
        owner = KeyOwner.from_fields(fields) if fields else None
        if owner is not None and self._live and self._use_cache:
            self._cache.put_key(epoch, digest, owner)
        return owner

    def _use_due(self, owner: KeyOwner, now: float) -> bool:
        """Whether this key's last use should be written now (at most every
        :data:`KEY_USE_INTERVAL_S`); claims the slot, so concurrent requests write once."""
        last = self._key_use.get(owner.key_id)
        if last is not None and now - last < KEY_USE_INTERVAL_S:
            return False
        if len(self._key_use) >= self._cache.max_entries:
            self._key_use.clear()  # bounded: at worst some keys are written a minute early
        self._key_use[owner.key_id] = now
        return True

    def _cached_adapter(self, tenant: str, name: str) -> Any:
        if not (self._live and self._use_cache):
            return MISSING
        return self._cache.adapters.get((tenant, name), MISSING)

    def _stale_user(self, tenant: str, user: str) -> Any:
        return self._serve_stale(self._cache.get_user(tenant, user))

    def _stale_adapter(self, tenant: str, name: str) -> Any:
        return self._serve_stale(self._cache.adapters.get((tenant, name), MISSING))

    def _stale_key(self, digest: str) -> Any:
        return self._serve_stale(self._cache.api_keys.get(digest, MISSING))

    def _serve_stale(self, value: Any) -> Any:
        """The cached answer for a lookup that failed because Redis is unreachable, or
        ``MISSING`` (then the caller re-raises).

        A cached entry is as current as the last event received before the connection
        dropped, and the replay on reconnect invalidates whatever changed meanwhile, so
        serving it beats failing every request of a user who was being served a moment ago.
        """
        if value is MISSING or not self._use_cache:
            return MISSING
        if not self._stale_logged:
            self._stale_logged = True
            logger.warning("Redis unreachable: answering from the registry cache until it is back")
        return value

    def _apply(self, event: RegistryEvent) -> None:
        self._cache.apply(event)
        if event.id and (
            self._cursor is None or stream_id_key(event.id) > stream_id_key(self._cursor)
        ):
            self._cursor = event.id
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # a consumer bug must not stop invalidation
                logger.exception("registry event listener failed")

    def _on_message(self, data: str) -> None:
        payload = json.loads(data)
        self._apply(RegistryEvent.from_fields(payload.pop("id", ""), payload))

    def _xrange_min(self, cursor: str) -> str:
        return "-" if cursor in ("", "0", "0-0") else f"({cursor}"

    @staticmethod
    def _trimmed(info: Mapping[str, Any] | None, cursor: str) -> bool:
        """Whether events after ``cursor`` may be missing (Redis >= 7 fields): trimmed or
        deleted, or the stream is gone or behind ``cursor`` because Redis came back without
        its data or from an older snapshot. Either way a consumer must rebuild its state.

        Conservative: a cursor equal to the last trimmed id also reports a reset.
        """
        at = stream_id_key(cursor or "0-0")
        if not info:
            return at > (0, 0)  # no stream, yet the consumer had seen events: data lost
        if at > stream_id_key(info.get("last-generated-id") or "0-0"):
            return True  # the stream is behind the consumer: rolled back
        if at < stream_id_key(info.get("max-deleted-entry-id") or "0-0"):
            return True  # XDEL'd entries
        if int(info.get("entries-added", 0)) <= int(info.get("length", 0)):
            return False  # nothing trimmed
        if not int(info.get("length", 0)):
            return at < stream_id_key(info.get("last-generated-id") or "0-0")
        return at < stream_id_key(info.get("recorded-first-entry-id") or "0-0")
