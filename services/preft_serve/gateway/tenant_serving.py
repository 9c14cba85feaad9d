"""A tenant's serving settings (``common.tenant_serving``), read from the registry's Redis
through a short cache, only when a request needs one.

When Redis does not answer in time, the last value read is used, else the default: a Redis
blip must not turn into errors for requests that the rest of the gateway can still serve
(an answer from the base model always says so, ``x-preft-adapter: none``).
"""

from __future__ import annotations

import asyncio
import logging
import time

import redis
import redis.asyncio as aioredis

from preft_serve.common.registry_client import RegistryKeys
from preft_serve.common.tenant_serving import (
    DEFAULT_UNBOUND_USER,
    UNBOUND_USER_FIELD,
    UnboundUser,
    parse_unbound_user,
)

logger = logging.getLogger(__name__)


class TenantServing:
    """``unbound_user`` per tenant, cached for ``cache_s`` seconds (without a Redis client,
    as with a test double of the registry: the default)."""

    def __init__(
        self, client: aioredis.Redis | None, namespace: str, cache_s: float, timeout_s: float
    ) -> None:
        self.redis, self.keys = client, RegistryKeys(namespace)
        self.cache_s, self.timeout_s = cache_s, timeout_s
        self._cache: dict[str, tuple[float, UnboundUser]] = {}

    async def unbound_user(self, tenant: str) -> UnboundUser:
        if self.redis is None:
            return DEFAULT_UNBOUND_USER
        now = time.monotonic()
        cached = self._cache.get(tenant)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            async with asyncio.timeout(self.timeout_s):
                raw = await self.redis.hget(self.keys.tenant(tenant), UNBOUND_USER_FIELD)
        except (redis.RedisError, TimeoutError) as exc:
            logger.warning(
                "tenant %s: serving settings unreadable (%r), using %s",
                tenant,
                exc,
                "the last ones read" if cached else "the defaults",
            )
            return cached[1] if cached is not None else DEFAULT_UNBOUND_USER
        value = parse_unbound_user(raw)
        self._cache[tenant] = (now + self.cache_s, value)
        return value
