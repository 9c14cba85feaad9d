"""asyncio registry client: a task on the starting event loop listens for events."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Self

import redis
import redis.asyncio as aioredis
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
    is_tenant_name,
)

logger = logging.getLogger(__name__)


class AsyncRegistryClient(ClientBase):
    """asyncio client with a listener task; same API as :class:`RegistryClient`, awaited."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        client: aioredis.Redis | None = None,
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
            client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        self.redis: Any = client
        self._resolve_user = client.register_script(RESOLVE_USER_LUA)
        self._task: asyncio.Task[None] | None = None
        self._caught_up = asyncio.Event()

    async def start(self, timeout: float = 10.0) -> Self:
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="registry-events")
        await asyncio.wait_for(self._caught_up.wait(), timeout)
        return self

    async def aclose(self) -> None:
        """Stop listening; closes the Redis client too if this object created it."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._live = False
        if self._owns_client:
            await self.redis.aclose()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def resolve_user(self, tenant: str, user: str) -> AdapterRef | None:
        hit = self._cached_user(tenant, user)
        if hit is not MISSING:
            return hit
        if not valid_user(tenant, user):
            return None  # no such binding can exist; never build a key from it
        epoch = self._cache.epoch
        try:
            raw = await self._resolve_user(
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

    async def resolve_adapter(self, tenant: str, name: str) -> AdapterRef | None:
        hit = self._cached_adapter(tenant, name)
        if hit is not MISSING:
            return hit
        if not valid_adapter(tenant, name):
            return None  # e.g. "bot:users" would read bot's user set
        epoch = self._cache.epoch
        try:
            values = await self.redis.hmget(self.keys.adapter(tenant, name), ADAPTER_FIELDS)
        except REDIS_DOWN:
            if (stale := self._stale_adapter(tenant, name)) is MISSING:
                raise
            return stale  # type: ignore[no-any-return]
        ref = parse_ref(tenant, name, values)
        if self._live and self._use_cache:
            self._cache.put(epoch, tenant, None, name, ref)
        return ref

    async def adapter_names(self, tenant: str, limit: int = 1000) -> list[str]:
        """The tenant's first ``limit`` adapter names in name order (not cached: a listing
        is rare, and the index is one sorted set)."""
        if not is_tenant_name(tenant):
            return []
        names = await self.redis.zrange(self.keys.adapters(tenant), 0, limit - 1)
        return [n.decode() if isinstance(n, bytes) else n for n in names]

    async def authenticate(self, api_key: str) -> KeyOwner | None:
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
            fields = await self.redis.hgetall(self.keys.api_key(digest))
        except REDIS_DOWN:
            if (stale := self._stale_key(digest)) is MISSING:
                raise
            return stale  # type: ignore[no-any-return]
        return self._store_key(epoch, digest, fields)

    async def blob_info(self, sha256: str) -> BlobInfo | None:
        if (hit := self._cache.blobs.get(sha256)) is not None:
            return hit
        if not is_digest(sha256):
            return None
        info = parse_blob(await self.redis.hgetall(self.keys.blob(sha256)))
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
        self._stale_logged = False
        self._listener_back()
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
                delay = self._listener_lost(exc)
                await asyncio.sleep(delay)
            finally:
                await pubsub.aclose()
