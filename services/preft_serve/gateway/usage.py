"""Per tenant, model and UTC day usage counters in Redis (read by the registry's
``GET /v1/usage``).

Each request a worker answered with 200 adds one to ``{model}:requests`` and its token counts
to ``{model}:prompt_tokens`` / ``{model}:completion_tokens`` of the hash
``RegistryKeys.usage(tenant, day)``, kept ``USAGE_TTL_S``. Requests only add to counts in
memory; a background task writes what accumulated once per ``flush_interval_s`` (1 s) as one
pipeline, and once more at shutdown. A Redis round trip per request was ~6% of the
gateway's CPU per request (profile in docs/benchmarks.md); the price is that a crash loses up
to a second of counts. A slow or unreachable Redis never fails or delays a request: the
batch is dropped (HINCRBY is not idempotent, so a write that timed out is not retried) and
counted in ``preft_gateway_usage_write_failures_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections import Counter
from collections.abc import Callable

import redis
import redis.asyncio as aioredis

from preft_serve.common.registry_client import USAGE_TTL_S, RegistryKeys, usage_field
from preft_serve.gateway.metrics import GatewayMetrics

logger = logging.getLogger(__name__)


def utc_day(now: datetime.datetime | None = None) -> str:
    """Today (or ``now``'s day) in UTC as YYYYMMDD."""
    return (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%d")


DAY_S = 86_400


class UtcToday:
    """:func:`utc_day` for now, formatted once a day instead of once a request (~1% of
    the gateway's CPU per request). Unix time has no leap seconds, so UTC days start at
    multiples of 86,400 s; a clock stepped back re-formats too."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._day, self._start, self._end = "", 0.0, 0.0

    def __call__(self) -> str:
        now = self._clock()
        if not self._start <= now < self._end:
            self._start = now // DAY_S * DAY_S
            self._end = self._start + DAY_S
            self._day = utc_day(datetime.datetime.fromtimestamp(now, datetime.UTC))
        return self._day


class UsageRecorder:
    """Counts in memory, flushed in the background; without a Redis client (tests) it
    records nothing."""

    def __init__(
        self,
        client: aioredis.Redis | None,
        namespace: str,
        metrics: GatewayMetrics,
        timeout_s: float = 0.5,
        flush_interval_s: float = 1.0,
    ) -> None:
        self.redis, self.metrics, self.timeout_s = client, metrics, timeout_s
        self.flush_interval_s = flush_interval_s
        self.keys = RegistryKeys(namespace)
        self._counts: dict[str, Counter[str]] = {}  # usage hash key -> field -> amount
        self._flusher: asyncio.Task[None] | None = None
        self._failing = False  # log outages once, not once per batch
        self._today = UtcToday()

    def record(
        self,
        tenant: str,
        model: str,
        requests: int = 0,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        """Add to the counts; returns at once (the next flush writes them)."""
        if self.redis is None:
            return
        counts = self._counts.setdefault(self.keys.usage(tenant, self._today()), Counter())
        for kind, n in (
            ("requests", requests),
            ("prompt_tokens", prompt_tokens),
            ("completion_tokens", completion_tokens),
        ):
            if n > 0:
                counts[usage_field(model, kind)] += n
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_every_interval())

    async def _flush_every_interval(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            await self.flush()

    async def flush(self) -> None:
        """Write what accumulated since the last flush, as one pipeline."""
        batch, self._counts = self._counts, {}
        batch = {key: fields for key, fields in batch.items() if fields}
        if not batch or self.redis is None:
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                pipe = self.redis.pipeline(transaction=False)
                for key, fields in batch.items():
                    for field, amount in fields.items():
                        pipe.hincrby(key, field, amount)
                    pipe.expire(key, USAGE_TTL_S)
                await pipe.execute()
        except (redis.RedisError, TimeoutError, OSError) as exc:
            self.metrics.usage_write_failures.inc()
            if not self._failing:
                logger.warning(
                    "usage counters not written (Redis failed or took over "
                    "%g s); dropping them until it answers: %r",
                    self.timeout_s,
                    exc,
                )
            self._failing = True
            return
        if self._failing:
            logger.info("usage counters written again")
            self._failing = False

    async def drain(self, timeout_s: float = 1.0) -> None:
        """Stop the background flushes and write what is left; at shutdown."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self.flush()
