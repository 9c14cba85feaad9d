"""The registry clients' logic, written once, without I/O ("sans-IO").

Every operation (resolve, authenticate, catch up, listen ...) is a generator that yields
the Redis calls it needs as :class:`Call` objects and receives their results (or has their
exceptions thrown into it). A driver does the I/O: :func:`drive` calls each one and blocks
(``RegistryClient``); :func:`drive_async` awaits the ones that return awaitables
(``AsyncRegistryClient``). So the sync and async clients differ only in their drivers,
their Redis client and how they start, stop and pause.

    def _blob_info(self, sha256):            # an operation
        fields = yield Call(self.redis.hgetall, (self.keys.blob(sha256),))
        return parse_blob(fields)

    info = drive(self._blob_info(sha))       # sync client
    info = await drive_async(self._blob_info(sha))  # async client
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import time
from collections.abc import Callable, Generator, Mapping
from typing import Any, TypeVar, cast

import redis

from preft_serve.adapters.format import is_digest
from preft_serve.common.registry_client.cache import (
    DEFAULT_MAX_ENTRIES,
    MISSING,
    REDIS_DOWN,
    RESOLVE_USER_LUA,
    ClientBase,
    parse_blob,
    parse_ref,
    parse_version,
    valid_adapter,
    valid_user,
)
from preft_serve.common.registry_client.contract import (
    ADAPTER_FIELDS,
    API_KEY_PREFIX,
    USAGE_TTL_S,
    AdapterRef,
    BlobInfo,
    ChangeBatch,
    KeyOwner,
    RegistryEvent,
    hash_api_key,
    is_tenant_name,
    split_pinned,
)

T = TypeVar("T")
CATCH_UP_PAGE = 1000  # events per changes_since round trip while catching up


# One quick retry on a fresh connection (commands on connections pooled before a Redis
# restart fail once); the same policy for the blocking and the asyncio client.
RETRY_ATTEMPTS = 2


def retry_backoff() -> Any:
    from redis.backoff import ExponentialBackoff

    return ExponentialBackoff(cap=0.1, base=0.01)


def without_retry(pool: Any) -> dict[str, Any]:
    """Arguments for a pool like ``pool`` whose connections never retry: the event
    listener must see a lost connection, because that is when it catches up on the events
    it missed (a retrying connection resubscribes silently, and those events are gone)."""
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k != "retry"}
    return {"connection_class": pool.connection_class, **kwargs}


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """One I/O step: ``fn(*args, **kwargs)``; the async driver awaits what it returns."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


Steps = Generator[Call, Any, T]


def drive(steps: Steps[T]) -> T:
    """Run an operation with blocking calls."""
    try:
        step = next(steps)
        while True:
            try:
                result = step.fn(*step.args, **step.kwargs)
            except BaseException as exc:  # noqa: BLE001 (thrown into the operation to decide)
                step = steps.throw(exc)
            else:
                step = steps.send(result)
    except StopIteration as done:
        return cast(T, done.value)


async def drive_async(steps: Steps[T]) -> T:
    """Run an operation on the event loop, awaiting the calls that return awaitables."""
    try:
        step = next(steps)
        while True:
            try:
                result = step.fn(*step.args, **step.kwargs)
                if inspect.isawaitable(result):
                    result = await result
            except BaseException as exc:  # noqa: BLE001 (also cancellation: `finally` runs)
                step = steps.throw(exc)
            else:
                step = steps.send(result)
    except StopIteration as done:
        return cast(T, done.value)


class RegistryCore(ClientBase):
    """Operations shared by both clients. A subclass says how to connect
    (:meth:`_connect`), sets up its listener (:meth:`_init_listener`, which creates
    ``_caught_up``: a threading or asyncio Event) and implements :meth:`_stopping`,
    :meth:`_pause` and :meth:`_close_pubsub`.

    ``client``: a redis-py client with ``decode_responses=True`` (blocking for
    ``RegistryClient``, ``redis.asyncio`` for ``AsyncRegistryClient``), else one is created
    from ``redis_url`` and closed with the client. ``cursor``: resume from a saved
    :attr:`cursor` (default: start from now). ``cache=False`` always reads Redis.
    """

    redis: Any  # redis-py's stubs say bytes | str; decode_responses=True makes it str
    _caught_up: Any  # threading.Event or asyncio.Event: set once the listener is live

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        client: Any = None,
        namespace: str = "preft",
        cache: bool = True,
        max_cache_entries: int = DEFAULT_MAX_ENTRIES,
        cursor: str | None = None,
    ) -> None:
        super().__init__(namespace, cache, max_cache_entries, cursor)
        self._owns_client = client is None
        if client is None:
            if redis_url is None:
                raise ValueError("pass redis_url or client")
            client = self._connect(redis_url)
        self.redis = client
        self._resolve_user_script = client.register_script(RESOLVE_USER_LUA)
        self._init_listener()

    # -- what differs between the clients ------------------------------------------------

    def _init_listener(self) -> None:
        """Create the listener's state (``_caught_up`` and what stops it)."""
        raise NotImplementedError

    @staticmethod
    def _connect(redis_url: str) -> Any:
        """A Redis client for ``redis_url`` with ``decode_responses=True``."""
        raise NotImplementedError

    def _stopping(self) -> bool:
        """Whether the listener should stop (the async one is cancelled instead)."""
        return False

    def _pause(self, seconds: float) -> Any:
        """Wait before the listener's next attempt (may return an awaitable)."""
        raise NotImplementedError

    def _new_pubsub(self) -> Any:
        """The listener's subscription (a client may use other connections for it)."""
        return self.redis.pubsub()

    def _close_pubsub(self, pubsub: Any) -> Any:
        """Close a pub/sub connection (may return an awaitable)."""
        raise NotImplementedError

    # -- lookups -------------------------------------------------------------------------

    def _resolve_user(self, tenant: str, user: str) -> Steps[AdapterRef | None]:
        hit = self._cached_user(tenant, user)
        if hit is not MISSING:
            return cast("AdapterRef | None", hit)
        if not valid_user(tenant, user):
            return None  # no such binding can exist; never build a key from it
        epoch = self._cache.epoch
        try:
            raw = yield Call(
                self._resolve_user_script,
                kwargs={
                    "keys": [self.keys.binding(tenant, user)],
                    "args": [self.keys.adapter_prefix(tenant)],
                },
            )
        except REDIS_DOWN:
            if (stale := self._stale_user(tenant, user)) is MISSING:
                raise
            return cast("AdapterRef | None", stale)
        name = raw[0] if raw else None
        ref = parse_ref(tenant, name, raw[1:]) if name else None
        if self._live and self._use_cache:
            self._cache.put(epoch, tenant, user, name, ref)
        return ref

    def _resolve_adapter(self, tenant: str, name: str) -> Steps[AdapterRef | None]:
        if (pinned := split_pinned(name)) is not None:
            return (yield from self._resolve_pinned(tenant, *pinned))
        hit = self._cached_adapter(tenant, name)
        if hit is not MISSING:
            return cast("AdapterRef | None", hit)
        if not valid_adapter(tenant, name):
            return None  # e.g. "bot:users" would read bot's user set
        epoch = self._cache.epoch
        try:
            values = yield Call(self.redis.hmget, (self.keys.adapter(tenant, name), ADAPTER_FIELDS))
        except REDIS_DOWN:
            if (stale := self._stale_adapter(tenant, name)) is MISSING:
                raise
            return cast("AdapterRef | None", stale)
        ref = parse_ref(tenant, name, values)
        if self._live and self._use_cache:
            self._cache.put(epoch, tenant, None, name, ref)
        return ref

    def _resolve_pinned(self, tenant: str, name: str, version: int) -> Steps[AdapterRef | None]:
        """One version of an adapter (``name@version``), read from its version history.
        Not cached: a deleted adapter's name may come back with other content as version
        1, and the events name adapters, not versions."""
        if not valid_adapter(tenant, name):
            return None
        pipe = self.redis.pipeline(transaction=True)
        pipe.hget(self.keys.adapter(tenant, name), "adapter_created_at")
        pipe.hget(self.keys.versions(tenant, name), str(version))
        created, raw = yield Call(pipe.execute)
        return parse_version(tenant, name, raw, created) if raw else None

    def _adapter_names(self, tenant: str, limit: int) -> Steps[list[str]]:
        if not is_tenant_name(tenant):
            return []
        names = yield Call(self.redis.zrange, (self.keys.adapters(tenant), 0, limit - 1))
        return [n.decode() if isinstance(n, bytes) else n for n in names]

    def _adapters(self, tenant: str, limit: int) -> Steps[list[AdapterRef]]:
        """Current versions of the first ``limit`` adapters by name: one round trip for the
        names, one pipelined round trip for their fields (not cached)."""
        names = [
            n for n in (yield from self._adapter_names(tenant, limit)) if valid_adapter(tenant, n)
        ]
        if not names:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.hmget(self.keys.adapter(tenant, name), ADAPTER_FIELDS)
        rows = yield Call(pipe.execute)
        refs = (parse_ref(tenant, name, row) for name, row in zip(names, rows, strict=True))
        return [ref for ref in refs if ref is not None]  # deleted between the two reads

    def _authenticate(self, api_key: str) -> Steps[KeyOwner | None]:
        """The key's owner, None for unknown, revoked or expired keys (expiry is checked
        on every call: a cached owner carries it)."""
        owner = yield from self._find_key(api_key)
        if owner is None or owner.expired(time.time()):
            return None
        return owner

    def _find_key(self, api_key: str) -> Steps[KeyOwner | None]:
        if not api_key.startswith(API_KEY_PREFIX):
            return None
        digest = hash_api_key(api_key)
        hit = self._cached_key(digest)
        if hit is not MISSING:
            return cast("KeyOwner", hit)
        epoch = self._cache.epoch
        try:
            fields = yield Call(self.redis.hgetall, (self.keys.api_key(digest),))
        except REDIS_DOWN:
            if (stale := self._stale_key(digest)) is MISSING:
                raise
            return cast("KeyOwner", stale)
        return self._store_key(epoch, digest, fields)

    def _record_use(self, owner: KeyOwner) -> Steps[None]:
        """Write when ``owner``'s key was last used (callers throttle with ``_use_due``)."""
        key = self.keys.key_use(owner.tenant)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, owner.key_id, dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
        pipe.expire(key, USAGE_TTL_S)
        yield Call(pipe.execute)

    def _blob_info(self, sha256: str) -> Steps[BlobInfo | None]:
        if (hit := self._cache.blobs.get(sha256)) is not None:
            return hit
        if not is_digest(sha256):
            return None
        info = parse_blob((yield Call(self.redis.hgetall, (self.keys.blob(sha256),))))
        if info is not None:
            self._cache.blobs[sha256] = info
        return info

    # -- events --------------------------------------------------------------------------

    def _latest_cursor(self) -> Steps[str]:
        last = yield Call(self.redis.xrevrange, (self.keys.events,), {"count": 1})
        return str(last[0][0]) if last else "0-0"

    def _changes_since(self, cursor: str, limit: int) -> Steps[ChangeBatch]:
        try:
            info = yield Call(self.redis.xinfo_stream, (self.keys.events,))
        except redis.ResponseError:  # no stream yet: nothing ever happened
            info = None
        entries = yield Call(
            self.redis.xrange,
            (self.keys.events,),
            {"min": self._xrange_min(cursor), "count": limit},
        )
        events = [RegistryEvent.from_fields(i, f) for i, f in entries]
        return ChangeBatch(events, events[-1].id if events else cursor, self._trimmed(info, cursor))

    def _catch_up(self) -> Steps[None]:
        """Replay what happened since the cursor (or start from now), then go live."""
        if self._cursor is None:
            self._cursor = yield from self._latest_cursor()
        else:
            while True:
                batch = yield from self._changes_since(self._cursor, CATCH_UP_PAGE)
                if batch.reset:
                    self._cache.clear()
                for event in batch.events:
                    self._apply(event)
                self._cursor = batch.cursor
                if len(batch.events) < CATCH_UP_PAGE:
                    break
        self._live = True
        self._stale_logged = False
        self._listener_back()
        self._caught_up.set()

    def _listen(self) -> Steps[None]:
        """Subscribe, catch up on every (re)subscription, apply events; on a lost
        connection back off and start over, until :meth:`_stopping`."""
        while not self._stopping():
            pubsub = self._new_pubsub()
            try:
                yield Call(pubsub.subscribe, (self.keys.channel,))
                while not self._stopping():
                    msg = yield Call(pubsub.get_message, kwargs={"timeout": 0.5})
                    if msg is None:
                        continue
                    if msg["type"] == "subscribe":  # first subscription or a reconnect
                        yield from self._catch_up()
                    elif msg["type"] == "message":
                        self._on_message(msg["data"])
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                delay = self._listener_lost(exc)
                yield Call(self._pause, (delay,))
            finally:
                yield Call(self._close_pubsub, (pubsub,))
