"""asyncio registry client: a task on the starting event loop listens for events."""

from __future__ import annotations

import asyncio
from typing import Any, Self

import redis.asyncio as aioredis
from preft_serve.common.registry_client.contract import (
    AdapterRef,
    BlobInfo,
    ChangeBatch,
    KeyOwner,
)
from preft_serve.common.registry_client.core import RegistryCore, drive_async


class AsyncRegistryClient(RegistryCore):
    """asyncio client with a listener task; same API as :class:`RegistryClient`, awaited
    (``client``: a ``redis.asyncio.Redis``)."""

    def _init_listener(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._caught_up = asyncio.Event()

    @staticmethod
    def _connect(redis_url: str) -> aioredis.Redis:
        return aioredis.Redis.from_url(redis_url, decode_responses=True)

    async def start(self, timeout: float = 10.0) -> Self:
        if self._task is None:
            self._task = asyncio.create_task(drive_async(self._listen()),
                                             name="registry-events")
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
        """Owner of a valid API key; ``None`` for unknown or revoked ones (cached until an
        ``apikey.revoked`` event)."""
        return await drive_async(self._authenticate(api_key))

    async def blob_info(self, sha256: str) -> BlobInfo | None:
        return await drive_async(self._blob_info(sha256))

    async def latest_cursor(self) -> str:
        return await drive_async(self._latest_cursor())

    async def changes_since(self, cursor: str = "0-0", limit: int = 1000) -> ChangeBatch:
        return await drive_async(self._changes_since(cursor, limit))
