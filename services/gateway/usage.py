"""Per tenant, model and UTC day usage counters in Redis (read by the registry's
``GET /v1/usage``).

Each request a worker answered with 200 adds one to ``{model}:requests`` and its token counts
to ``{model}:prompt_tokens`` / ``{model}:completion_tokens`` of the hash
``RegistryKeys.usage(tenant, day)``, kept ``USAGE_TTL_S``. The writes run in the background
with the gateway's own Redis handle and a short timeout: a slow or unreachable Redis never
fails or delays a request, the lost write is counted in
``preft_gateway_usage_write_failures_total`` instead.
"""

from __future__ import annotations

import asyncio
import datetime
import logging

import redis
import redis.asyncio as aioredis
from preft_serve.common.registry_client import USAGE_TTL_S, RegistryKeys, usage_field
from preft_serve.gateway.metrics import GatewayMetrics

logger = logging.getLogger(__name__)


def utc_day(now: datetime.datetime | None = None) -> str:
    """Today (or ``now``'s day) in UTC as YYYYMMDD."""
    return (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%d")


class UsageRecorder:
    """Fire-and-forget HINCRBYs; without a Redis client (tests) it records nothing."""

    def __init__(self, client: aioredis.Redis | None, namespace: str, metrics: GatewayMetrics,
                 timeout_s: float = 0.5) -> None:
        self.redis, self.metrics, self.timeout_s = client, metrics, timeout_s
        self.keys = RegistryKeys(namespace)
        self._pending: set[asyncio.Task[None]] = set()
        self._failing = False  # log outages once, not once per request

    def record(self, tenant: str, model: str, requests: int = 0, prompt_tokens: int = 0,
               completion_tokens: int = 0) -> None:
        """Schedule the counters' increments; returns at once."""
        if self.redis is None:
            return
        counts = {"requests": requests, "prompt_tokens": prompt_tokens,
                  "completion_tokens": completion_tokens}
        fields = {usage_field(model, kind): n for kind, n in counts.items() if n > 0}
        if not fields:
            return
        task = asyncio.create_task(self._write(self.keys.usage(tenant, utc_day()), fields))
        self._pending.add(task)  # the event loop keeps only weak references to tasks
        task.add_done_callback(self._pending.discard)

    async def _write(self, key: str, fields: dict[str, int]) -> None:
        assert self.redis is not None
        try:
            async with asyncio.timeout(self.timeout_s):
                pipe = self.redis.pipeline(transaction=False)
                for field, amount in fields.items():
                    pipe.hincrby(key, field, amount)
                pipe.expire(key, USAGE_TTL_S)
                await pipe.execute()
        except (redis.RedisError, TimeoutError, OSError) as exc:
            self.metrics.usage_write_failures.inc()
            if not self._failing:
                logger.warning("usage counters not written (Redis failed or took over "
                               "%g s); dropping them until it answers: %r", self.timeout_s, exc)
            self._failing = True
            return
        if self._failing:
            logger.info("usage counters written again")
            self._failing = False

    async def drain(self, timeout_s: float = 1.0) -> None:
        """Wait (briefly) for the writes in flight; at shutdown."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)
