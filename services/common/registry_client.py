"""Read side of the adapter registry, for the gateway and the workers.

Resolves ``(tenant, user)`` and ``(tenant, adapter name)`` to an :class:`AdapterRef`
(name, version, sha256, type, mode, ...) straight from the registry's Redis, with a local
cache that the registry's change events invalidate, and lists changes since a cursor so a
consumer that was away can catch up.

Two flavours share one cache and one key layout:

* :class:`RegistryClient` — blocking redis-py; a daemon thread listens for events.
  Thread-safe: call it from any number of threads (or from ``run_in_executor``).
* :class:`AsyncRegistryClient` — ``redis.asyncio``; an asyncio task listens for events.
  Use it from one event loop (the one that called ``start``); it is not thread-safe.

Consistency: events travel over Redis pub/sub, and each carries its id in the registry's
event stream. Every (re)subscription replays the stream from the last id seen before the
cache is trusted again, so nothing published while disconnected is missed. While the
listener is down the client is not ``live`` and every lookup goes to Redis. A lookup that
raced with an event is not cached (an epoch counter detects the race).

This module is also the contract for the Redis layout (:class:`RegistryKeys`) and the event
format (:class:`RegistryEvent`); the registry service writes what this module reads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Self

import redis
import redis.asyncio as aioredis
from preft_serve.common.adapter_format import AdapterMode, AdapterType

logger = logging.getLogger(__name__)

ADAPTER_FIELDS = ("version", "sha256", "type", "mode", "rank", "base_model")


class RegistryKeys:
    """Every Redis key and channel the registry uses, under one namespace."""

    def __init__(self, namespace: str = "preft") -> None:
        self.ns = namespace
        self.tenants = f"{namespace}:tenants"  # SET of tenant names
        self.events = f"{namespace}:events"  # STREAM of RegistryEvent fields
        self.channel = f"{namespace}:events:live"  # pub/sub: JSON RegistryEvent with id

    def tenant(self, tenant: str) -> str:  # HASH name, created_at
        return f"{self.ns}:tenant:{tenant}"

    def tenant_keys(self, tenant: str) -> str:  # HASH key_id -> JSON {key_id, hash, created_at}
        return f"{self.ns}:tenant:{tenant}:keys"

    def api_key(self, key_hash: str) -> str:  # HASH tenant, key_id
        return f"{self.ns}:apikey:{key_hash}"

    def adapters(self, tenant: str) -> str:  # ZSET (score 0) of adapter names, for paging
        return f"{self.ns}:tenant:{tenant}:adapters"

    def adapter_prefix(self, tenant: str) -> str:
        return f"{self.ns}:tenant:{tenant}:adapter:"

    def adapter(self, tenant: str, name: str) -> str:  # HASH current version (ADAPTER_FIELDS+)
        return f"{self.adapter_prefix(tenant)}{name}"

    def versions(self, tenant: str, name: str) -> str:  # HASH version -> JSON version record
        return f"{self.adapter(tenant, name)}:versions"

    def adapter_users(self, tenant: str, name: str) -> str:  # SET of user ids bound to it
        return f"{self.adapter(tenant, name)}:users"

    def binding(self, tenant: str, user: str) -> str:  # STRING adapter name
        return f"{self.ns}:tenant:{tenant}:user:{user}"

    def blob(self, sha256: str) -> str:  # HASH sha256, type, mode, rank, base_model, config...
        return f"{self.ns}:blob:{sha256}"


class EventType(str, enum.Enum):
    """Kinds of change the registry publishes."""

    ADAPTER_UPDATED = "adapter.updated"  # new current version (incl. the first)
    ADAPTER_DELETED = "adapter.deleted"  # adapter and, if forced, its bindings are gone
    BINDING_UPDATED = "binding.updated"
    BINDING_DELETED = "binding.deleted"
    TENANT_CREATED = "tenant.created"
    API_KEY_CREATED = "apikey.created"
    API_KEY_REVOKED = "apikey.revoked"


@dataclasses.dataclass(frozen=True)
class RegistryEvent:
    """One change. ``id`` is its position in the event stream (the catch-up cursor)."""

    type: str
    tenant: str
    id: str = ""
    adapter: str | None = None
    user: str | None = None
    version: int | None = None
    sha256: str | None = None
    key_id: str | None = None
    ts: float = 0.0

    def fields(self) -> dict[str, str]:
        """Flat string fields as stored in the stream (``id`` is assigned by Redis)."""
        out = {"type": self.type, "tenant": self.tenant, "ts": f"{self.ts or time.time():.3f}"}
        for name in ("adapter", "user", "version", "sha256", "key_id"):
            value = getattr(self, name)
            if value is not None:
                out[name] = str(value)
        return out

    @classmethod
    def from_fields(cls, event_id: str, fields: Mapping[str, str]) -> RegistryEvent:
        version = fields.get("version")
        return cls(
            id=event_id,
            type=fields.get("type", ""),
            tenant=fields.get("tenant", ""),
            adapter=fields.get("adapter"),
            user=fields.get("user"),
            version=int(version) if version else None,
            sha256=fields.get("sha256"),
            key_id=fields.get("key_id"),
            ts=float(fields.get("ts", 0) or 0),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class AdapterRef:
    """What a request needs to run an adapter: its content hash and how to apply it."""

    tenant: str
    name: str
    version: int
    sha256: str
    type: AdapterType
    mode: AdapterMode
    rank: int
    base_model: str


@dataclasses.dataclass(frozen=True)
class BlobInfo:
    """Metadata of stored adapter content, enough for a worker to load it by hash alone."""

    sha256: str
    type: AdapterType
    mode: AdapterMode
    rank: int
    base_model: str
    size_bytes: int
    config: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ChangeBatch:
    """Events after a cursor. ``reset``: some were trimmed away, so rebuild all state."""

    events: list[RegistryEvent]
    cursor: str
    reset: bool


def stream_id_key(event_id: str) -> tuple[int, int]:
    """Sort key of a Redis stream id ``ms-seq``."""
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


# One round trip: binding -> adapter name -> current version fields.
_RESOLVE_USER_LUA = (
    "local name = redis.call('GET', KEYS[1])\n"
    "if not name then return false end\n"
    "local f = redis.call('HMGET', ARGV[1] .. name, "
    + ", ".join(f"'{f}'" for f in ADAPTER_FIELDS)
    + ")\nreturn {name, unpack(f)}\n"
)

_MISSING: Any = object()
Listener = Callable[[RegistryEvent], None]


def _ref(tenant: str, name: str, values: list[Any]) -> AdapterRef | None:
    if not values or values[0] is None:
        return None
    version, sha256, type_, mode, rank, base_model = values
    return AdapterRef(
        tenant, name, int(version), str(sha256), AdapterType(type_), AdapterMode(mode),
        int(rank or 0), str(base_model or ""),
    )


def _blob(fields: Mapping[str, str]) -> BlobInfo | None:
    if not fields:
        return None
    return BlobInfo(
        sha256=fields["sha256"], type=AdapterType(fields["type"]),
        mode=AdapterMode(fields["mode"]), rank=int(fields["rank"]),
        base_model=fields.get("base_model", ""), size_bytes=int(fields.get("size_bytes", 0)),
        config=json.loads(fields.get("config", "{}")),
    )


class _Cache:
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
        self.epoch = 0
        self.lock = threading.Lock()

    def get_user(self, tenant: str, user: str) -> Any:
        name = self.users.get((tenant, user), _MISSING)
        if name is _MISSING or name is None:
            return name
        return self.adapters.get((tenant, name), _MISSING)

    def put(self, epoch: int, tenant: str, user: str | None, name: str | None,
            ref: AdapterRef | None) -> None:
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
            elif event.type not in {e.value for e in EventType}:
                self.users.clear()  # unknown kind of change: forget everything
                self.adapters.clear()

    def clear(self) -> None:
        with self.lock:
            self.epoch += 1
            self.users.clear()
            self.adapters.clear()


class _Base:
    """State and event handling shared by the sync and async clients."""

    def __init__(self, namespace: str, cache: bool, max_cache_entries: int,
                 cursor: str | None) -> None:
        self.keys = RegistryKeys(namespace)
        self._use_cache = cache
        self._cache = _Cache(max_cache_entries)
        self._listeners: list[Listener] = []
        self._cursor: str | None = cursor
        self._live = False

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

    def invalidate_all(self) -> None:
        self._cache.clear()

    def _cached_user(self, tenant: str, user: str) -> Any:
        return self._cache.get_user(tenant, user) if self._live and self._use_cache else _MISSING

    def _cached_adapter(self, tenant: str, name: str) -> Any:
        if not (self._live and self._use_cache):
            return _MISSING
        return self._cache.adapters.get((tenant, name), _MISSING)

    def _apply(self, event: RegistryEvent) -> None:
        self._cache.apply(event)
        if event.id and (self._cursor is None or stream_id_key(event.id) > stream_id_key(
            self._cursor
        )):
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
        """Whether events after ``cursor`` may have been trimmed away (Redis >= 7 fields).

        Conservative: a cursor equal to the last trimmed id also reports a reset.
        """
        if not info:
            return False
        at = stream_id_key(cursor or "0-0")
        if at < stream_id_key(info.get("max-deleted-entry-id") or "0-0"):
            return True  # XDEL'd entries
        if int(info.get("entries-added", 0)) <= int(info.get("length", 0)):
            return False  # nothing trimmed
        if not int(info.get("length", 0)):
            return at < stream_id_key(info.get("last-generated-id") or "0-0")
        return at < stream_id_key(info.get("recorded-first-entry-id") or "0-0")


class RegistryClient(_Base):
    """Blocking client with a listener thread; see the module docstring.

    ``cursor``: resume from a saved :attr:`cursor` — ``start`` replays every event since it
    to the listeners before going live (default: start from now). ``cache=False`` always
    reads Redis (the registry itself reads this way).

    >>> client = RegistryClient("redis://localhost:6379/0").start()
    >>> ref = client.resolve_user("acme", "user-42")   # AdapterRef | None
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        client: redis.Redis | None = None,
        namespace: str = "preft",
        cache: bool = True,
        max_cache_entries: int = 1_000_000,
        cursor: str | None = None,
    ) -> None:
        super().__init__(namespace, cache, max_cache_entries, cursor)
        if client is None:
            if redis_url is None:
                raise ValueError("pass redis_url or client")
            client = redis.Redis.from_url(redis_url, decode_responses=True)
        # decode_responses=True: replies are str (redis-py's stubs say bytes | str).
        self.redis: Any = client
        self._resolve_user = client.register_script(_RESOLVE_USER_LUA)
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 10.0) -> Self:
        """Start the event listener; return once it is live (or raise TimeoutError)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._listen, name="registry-events",
                                            daemon=True)
            self._thread.start()
        if not self._caught_up.wait(timeout):
            raise TimeoutError("registry client could not subscribe to events in time")
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._live = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def resolve_user(self, tenant: str, user: str) -> AdapterRef | None:
        """Adapter bound to ``user`` in ``tenant``; ``None`` when unbound (base model)."""
        hit = self._cached_user(tenant, user)
        if hit is not _MISSING:
            return hit
        epoch = self._cache.epoch
        raw = self._resolve_user(
            keys=[self.keys.binding(tenant, user)], args=[self.keys.adapter_prefix(tenant)]
        )
        name = raw[0] if raw else None
        ref = _ref(tenant, name, raw[1:]) if name else None
        if self._live and self._use_cache:
            self._cache.put(epoch, tenant, user, name, ref)
        return ref

    def resolve_adapter(self, tenant: str, name: str) -> AdapterRef | None:
        """Current version of a tenant's adapter; ``None`` if it does not exist."""
        hit = self._cached_adapter(tenant, name)
        if hit is not _MISSING:
            return hit
        epoch = self._cache.epoch
        ref = _ref(tenant, name, self.redis.hmget(self.keys.adapter(tenant, name),
                                                  ADAPTER_FIELDS))
        if self._live and self._use_cache:
            self._cache.put(epoch, tenant, None, name, ref)
        return ref

    def blob_info(self, sha256: str) -> BlobInfo | None:
        """Type, mode, rank, base model and config of stored content (immutable: cached)."""
        if (hit := self._cache.blobs.get(sha256)) is not None:
            return hit
        info = _blob(self.redis.hgetall(self.keys.blob(sha256)))
        if info is not None:
            self._cache.blobs[sha256] = info
        return info

    def latest_cursor(self) -> str:
        """Id of the newest event ("0-0" when none): where a fresh consumer starts."""
        last = self.redis.xrevrange(self.keys.events, count=1)
        return last[0][0] if last else "0-0"

    def changes_since(self, cursor: str = "0-0", limit: int = 1000) -> ChangeBatch:
        """Up to ``limit`` events after ``cursor``, the next cursor, and a reset flag."""
        try:
            info = self.redis.xinfo_stream(self.keys.events)
        except redis.ResponseError:  # no stream yet: nothing ever happened
            info = None
        entries = self.redis.xrange(self.keys.events, min=self._xrange_min(cursor), count=limit)
        events = [RegistryEvent.from_fields(i, f) for i, f in entries]
        return ChangeBatch(events, events[-1].id if events else cursor, self._trimmed(info, cursor))

    def _catch_up(self) -> None:
        if self._cursor is None:
            self._cursor = self.latest_cursor()
        else:
            while True:
                batch = self.changes_since(self._cursor)
                if batch.reset:
                    self._cache.clear()
                for event in batch.events:
                    self._apply(event)
                self._cursor = batch.cursor
                if len(batch.events) < 1000:
                    break
        self._live = True
        self._caught_up.set()

    def _listen(self) -> None:
        while not self._stop.is_set():
            pubsub = self.redis.pubsub()
            try:
                pubsub.subscribe(self.keys.channel)
                while not self._stop.is_set():
                    msg = pubsub.get_message(timeout=0.5)
                    if msg is None:
                        continue
                    if msg["type"] == "subscribe":  # first subscription or a reconnect
                        self._catch_up()
                    elif msg["type"] == "message":
                        self._on_message(msg["data"])
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                self._live = False
                logger.warning("registry event listener lost Redis (%s); retrying", exc)
                self._stop.wait(0.5)
            finally:
                pubsub.close()


class AsyncRegistryClient(_Base):
    """asyncio client with a listener task; same API as :class:`RegistryClient`, awaited."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        client: aioredis.Redis | None = None,
        namespace: str = "preft",
        cache: bool = True,
        max_cache_entries: int = 1_000_000,
        cursor: str | None = None,
    ) -> None:
        super().__init__(namespace, cache, max_cache_entries, cursor)
        if client is None:
            if redis_url is None:
                raise ValueError("pass redis_url or client")
            client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        self.redis: Any = client
        self._resolve_user = client.register_script(_RESOLVE_USER_LUA)
        self._task: asyncio.Task[None] | None = None
        self._caught_up = asyncio.Event()

    async def start(self, timeout: float = 10.0) -> Self:
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="registry-events")
        await asyncio.wait_for(self._caught_up.wait(), timeout)
        return self

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._live = False

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def resolve_user(self, tenant: str, user: str) -> AdapterRef | None:
        hit = self._cached_user(tenant, user)
        if hit is not _MISSING:
            return hit
        epoch = self._cache.epoch
        raw = await self._resolve_user(
            keys=[self.keys.binding(tenant, user)], args=[self.keys.adapter_prefix(tenant)]
        )
        name = raw[0] if raw else None
        ref = _ref(tenant, name, raw[1:]) if name else None
        if self._live and self._use_cache:
            self._cache.put(epoch, tenant, user, name, ref)
        return ref

    async def resolve_adapter(self, tenant: str, name: str) -> AdapterRef | None:
        hit = self._cached_adapter(tenant, name)
        if hit is not _MISSING:
            return hit
        epoch = self._cache.epoch
        values = await self.redis.hmget(self.keys.adapter(tenant, name), ADAPTER_FIELDS)
        ref = _ref(tenant, name, values)
        if self._live and self._use_cache:
            self._cache.put(epoch, tenant, None, name, ref)
        return ref

    async def blob_info(self, sha256: str) -> BlobInfo | None:
        if (hit := self._cache.blobs.get(sha256)) is not None:
            return hit
        info = _blob(await self.redis.hgetall(self.keys.blob(sha256)))
        if info is not None:
            self._cache.blobs[sha256] = info
        return info

    async def latest_cursor(self) -> str:
        last = await self.redis.xrevrange(self.keys.events, count=1)
        return last[0][0] if last else "0-0"

    async def changes_since(self, cursor: str = "0-0", limit: int = 1000) -> ChangeBatch:
        try:
            info = await self.redis.xinfo_stream(self.keys.events)
        except redis.ResponseError:
            info = None
        entries = await self.redis.xrange(
            self.keys.events, min=self._xrange_min(cursor), count=limit
        )
        events = [RegistryEvent.from_fields(i, f) for i, f in entries]
        return ChangeBatch(events, events[-1].id if events else cursor, self._trimmed(info, cursor))

    async def _catch_up(self) -> None:
        if self._cursor is None:
            self._cursor = await self.latest_cursor()
        else:
            while True:
                batch = await self.changes_since(self._cursor)
                if batch.reset:
                    self._cache.clear()
                for event in batch.events:
                    self._apply(event)
                self._cursor = batch.cursor
                if len(batch.events) < 1000:
                    break
        self._live = True
        self._caught_up.set()

    async def _listen(self) -> None:
        while True:
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(self.keys.channel)
                while True:
                    msg = await pubsub.get_message(timeout=0.5)
                    if msg is None:
                        continue
                    if msg["type"] == "subscribe":
                        await self._catch_up()
                    elif msg["type"] == "message":
                        self._on_message(msg["data"])
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                self._live = False
                logger.warning("registry event listener lost Redis (%s); retrying", exc)
                await asyncio.sleep(0.5)
            finally:
                await pubsub.aclose()
