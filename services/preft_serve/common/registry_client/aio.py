"""asyncio registry client: a task on the starting event loop listens for events."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Self

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry

from preft_serve.common.registry_client.contract import (
    AdapterRef,
    BlobInfo,
    ChangeBatch,
    KeyOwner,
)
from preft_serve.common.registry_client.core import (
    RETRY_ATTEMPTS,
    RegistryCore,
    drive_async,
    retry_backoff,
    without_retry,
)

logger = logging.getLogger(__name__)


def connect_redis(url: str) -> aioredis.Redis:
    """An asyncio Redis client whose commands survive a Redis restart.

    Without a retry, every connection pooled before the restart fails its next command
    ("Connection closed by server"), so single requests failed long after Redis was back
    (found by the soak, ``bench/soak/``). The retry (on ConnectionError and
    TimeoutError) drops the broken connection and tries a fresh one.
    """
    return aioredis.Redis.from_url(
        url, decode_responses=True, retry=Retry(retry_backoff(), RETRY_ATTEMPTS)
    )


class AsyncRegistryClient(RegistryCore):
    """asyncio client with a listener task; same API as :class:`RegistryClient`, awaited
    (``client``: a ``redis.asyncio.Redis``)."""

    def _init_listener(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._use_writes: set[asyncio.Task[None]] = set()
        self._caught_up = asyncio.Event()
        self._listen_redis: aioredis.Redis | None = None

    def _new_pubsub(self) -> Any:
        """The listener's subscription, on connections that never retry (``without_retry``)."""
        if self._listen_redis is None:
            self._listen_redis = aioredis.Redis(
                connection_pool=aioredis.ConnectionPool(**without_retry(self.redis.connection_pool))
            )
        return self._listen_redis.pubsub()

    @staticmethod
    def _connect(redis_url: str) -> aioredis.Redis:
        return connect_redis(redis_url)

    async def start(self, timeout: float = 10.0) -> Self:
        if self._task is None:
            self._task = asyncio.create_task(drive_async(self._listen()), name="registry-events")
        await asyncio.wait_for(self._caught_up.wait(), timeout)
        return self

    async def aclose(self) -> None:
        """Stop listening; closes the Redis client too if this object created it."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for write in list(self._use_writes):
            write.cancel()
        self._live = False
        if self._listen_redis is not None:
            await self._listen_redis.aclose(close_connection_pool=True)
            self._listen_redis = None
        if self._owns_client:
            await self.redis.aclose()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _pause(self, seconds: float) -> Any:
        return asyncio.sleep(seconds)

    def _close_pubsub(self, pubsub: Any) -> Any:
        return pubsub.aclose()

    async def resolve_user(self, tenant: str, user: str) -> AdapterRef | None:
        return await drive_async(self._resolve_user(tenant, user))

    async def resolve_adapter(self, tenant: str, name: str) -> AdapterRef | None:
        return await drive_async(self._resolve_adapter(tenant, name))

    async def adapter_names(self, tenant: str, limit: int = 1000) -> list[str]:
        """The tenant's first ``limit`` adapter names in name order (not cached: a listing
        is rare, and the index is one sorted set)."""
        return await drive_async(self._adapter_names(tenant, limit))

    async def adapters(self, tenant: str, limit: int = 1000) -> list[AdapterRef]:
        """Current versions of the tenant's first ``limit`` adapters in name order (not
        cached, like :meth:`adapter_names`)."""
        return await drive_async(self._adapters(tenant, limit))

    async def authenticate(self, api_key: str) -> KeyOwner | None:
        """Owner of a valid API key; ``None`` for unknown, revoked or expired ones (cached
        until an ``apikey.revoked`` event; expiry checked on every call). The key's last
        use is written in the background, at most once a minute per key."""
        owner = await drive_async(self._authenticate(api_key))
        if owner is not None and self._use_due(owner, time.monotonic()):
            write = asyncio.get_running_loop().create_task(self._write_use(owner))
            self._use_writes.add(write)
            write.add_done_callback(self._use_writes.discard)
        return owner

    async def _write_use(self, owner: KeyOwner) -> None:
        try:
            await drive_async(self._record_use(owner))
        except Exception as exc:  # noqa: BLE001 (bookkeeping: never a request's failure)
            logger.warning("could not record the use of key %s: %s", owner.key_id, exc)

    async def blob_info(self, sha256: str) -> BlobInfo | None:
        return await drive_async(self._blob_info(sha256))

    async def latest_cursor(self) -> str:
        return await drive_async(self._latest_cursor())

    async def changes_since(self, cursor: str = "0-0", limit: int = 1000) -> ChangeBatch:
        return await drive_async(self._changes_since(cursor, limit))
