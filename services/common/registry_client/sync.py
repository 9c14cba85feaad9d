"""Blocking registry client: a daemon thread listens for events; thread-safe."""

from __future__ import annotations

import logging
import threading
from typing import Any, Self

import redis
from preft_serve.common.adapter_format import is_digest
from preft_serve.common.registry_client.cache import (
    DEFAULT_MAX_ENTRIES,
    MISSING,
    REDIS_DOWN,
    RESOLVE_USER_LUA,
    ClientBase,
    parse_blob,
    parse_ref,
    valid_adapter,
    valid_user,
)
from preft_serve.common.registry_client.contract import (
    ADAPTER_FIELDS,
    API_KEY_PREFIX,
    AdapterRef,
    BlobInfo,
    ChangeBatch,
    KeyOwner,
    RegistryEvent,
    hash_api_key,
)

logger = logging.getLogger(__name__)


class RegistryClient(ClientBase):
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
        max_cache_entries: int = DEFAULT_MAX_ENTRIES,
        cursor: str | None = None,
    ) -> None:
        super().__init__(namespace, cache, max_cache_entries, cursor)
        self._owns_client = client is None
        if client is None:
            if redis_url is None:
                raise ValueError("pass redis_url or client")
            client = redis.Redis.from_url(redis_url, decode_responses=True)
        # decode_responses=True: replies are str (redis-py's stubs say bytes | str).
        self.redis: Any = client
        self._resolve_user = client.register_script(RESOLVE_USER_LUA)
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
        """Stop listening; closes the Redis client too if this object created it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._live = False
        if self._owns_client:
            self.redis.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def resolve_user(self, tenant: str, user: str) -> AdapterRef | None:
        """Adapter bound to ``user`` in ``tenant``; ``None`` when unbound (base model)."""
        hit = self._cached_user(tenant, user)
        if hit is not MISSING:
            return hit
        if not valid_user(tenant, user):
            return None  # no such binding can exist; never build a key from it
        epoch = self._cache.epoch
        try:
            raw = self._resolve_user(
                keys=[self.keys.binding(tenant, user)], args=[self.keys.adapter_prefix(tenant)]
            )
        except REDIS_DOWN:
            if (stale := self._stale_user(tenant, user)) is MISSING:
                raise
            return stale  # type: ignore[no-any-return]
        name = raw[0] if raw else None
        ref = parse_ref(tenant, name, raw[1:]) if name else None
        if self._live and self._use_cache:
            self._cache.put(epoch, tenant, user, name, ref)
        return ref

    def resolve_adapter(self, tenant: str, name: str) -> AdapterRef | None:
        """Current version of a tenant's adapter; ``None`` if it does not exist."""
        hit = self._cached_adapter(tenant, name)
        if hit is not MISSING:
            return hit
        if not valid_adapter(tenant, name):
            return None  # e.g. "bot:users" would read bot's user set
        epoch = self._cache.epoch
        try:
            values = self.redis.hmget(self.keys.adapter(tenant, name), ADAPTER_FIELDS)
        except REDIS_DOWN:
            if (stale := self._stale_adapter(tenant, name)) is MISSING:
                raise
            return stale  # type: ignore[no-any-return]
        ref = parse_ref(tenant, name, values)
        if self._live and self._use_cache:
            self._cache.put(epoch, tenant, None, name, ref)
        return ref

    def authenticate(self, api_key: str) -> KeyOwner | None:
        """Owner of a valid API key; ``None`` for unknown or revoked ones (cached until an
        ``apikey.revoked`` event)."""
        if not api_key.startswith(API_KEY_PREFIX):
            return None
        digest = hash_api_key(api_key)
        hit = self._cached_key(digest)
        if hit is not MISSING:
            return hit  # type: ignore[no-any-return]
        epoch = self._cache.epoch
        try:
            fields = self.redis.hgetall(self.keys.api_key(digest))
        except REDIS_DOWN:
            if (stale := self._stale_key(digest)) is MISSING:
                raise
            return stale  # type: ignore[no-any-return]
        return self._store_key(epoch, digest, fields)

    def blob_info(self, sha256: str) -> BlobInfo | None:
        """Type, mode, rank, base model and config of stored content (immutable: cached)."""
        if (hit := self._cache.blobs.get(sha256)) is not None:
            return hit
        if not is_digest(sha256):
            return None
        info = parse_blob(self.redis.hgetall(self.keys.blob(sha256)))
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
        self._stale_logged = False
        self._listener_back()
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
                delay = self._listener_lost(exc)
                self._stop.wait(delay)
            finally:
                pubsub.close()
