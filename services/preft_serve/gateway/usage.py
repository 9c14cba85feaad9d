"""Per tenant usage counters in Redis (read by the registry's ``GET /v1/usage``).

Each request a worker answered with 200 adds one to ``{model}:requests`` and its token counts
to ``{model}:prompt_tokens`` / ``{model}:completion_tokens`` of the hash
``RegistryKeys.usage(tenant, day)``, kept ``USAGE_TTL_S``, and the same counts to the
per-user, per-key and per-hour hashes of ``common.usage_breakdown`` (bounded there).
Requests only add to counts in memory; a background task writes what accumulated once per
``flush_interval_s`` (1 s) as one pipeline, and once more at shutdown. A Redis round trip
per request was ~6% of the gateway's CPU per request (profile in docs/benchmarks.md); the
price is that a crash loses up to a second of counts. A slow or unreachable Redis never
fails or delays a request: the batch is dropped (HINCRBY is not idempotent, so a write that
timed out is not retried) and counted in ``preft_gateway_usage_write_failures_total``.
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

from preft_serve.common.registry_client import USAGE_TTL_S, RegistryKeys, is_user_id, usage_field
from preft_serve.common.usage_breakdown import (
    CAPPED,
    CAPPED_INCREMENT,
    DIMENSIONS,
    HOURLY_TTL_S,
    NAMED_PER_BUCKET,
    NO_USER,
    OTHER,
    capped_args,
    day_key,
    hour_key,
)
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


class UtcHour:
    """The current UTC hour as YYYYMMDDHH, formatted once an hour (as :class:`UtcToday`)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._hour, self._start, self._end = "", 0.0, 0.0

    def __call__(self) -> str:
        now = self._clock()
        if not self._start <= now < self._end:
            self._start = now // HOUR_S * HOUR_S
            self._end = self._start + HOUR_S
            self._hour = datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y%m%d%H")
        return self._hour


HOUR_S = 3600


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
        clock: Callable[[], float] = time.time,
        named_per_bucket: int = NAMED_PER_BUCKET,
    ) -> None:
        self.redis, self.metrics, self.timeout_s = client, metrics, timeout_s
        self.flush_interval_s = flush_interval_s
        self.keys = RegistryKeys(namespace)
        self.named_per_bucket = named_per_bucket
        self._counts: dict[str, Counter[str]] = {}  # usage hash key -> field -> amount
        # Hashes whose names are capped (per user, per key) and the hourly ones (their TTL).
        self._capped: set[str] = set()
        self._hourly: set[str] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._failing = False  # log outages once, not once per batch
        self._hour = UtcHour(clock)
        self._keys_hour = ""
        self._keys: dict[str, list[tuple[str, str, bool]]] = {}  # this hour's, per tenant

    def record(
        self,
        tenant: str,
        model: str,
        requests: int = 0,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        user: str | None = None,
        key_id: str | None = None,
    ) -> None:
        """Add to the counts; returns at once (the next flush writes them). ``user``: the
        request's user id (None: it named none); ``key_id``: the id of the key it used."""
        if self.redis is None:
            return
        hour = self._hour()
        names = {
            "model": model,
            "user": user if user is not None and is_user_id(user) else NO_USER,
            "key": key_id or OTHER,
        }
        amounts = (
            ("requests", requests),
            ("prompt_tokens", prompt_tokens),
            ("completion_tokens", completion_tokens),
        )
        for dimension, key, hourly in self._hashes(tenant, hour):
            name = names[dimension]
            counts = self._counts.setdefault(key, Counter())
            if dimension in CAPPED:
                self._capped.add(key)
            if hourly:
                self._hourly.add(key)
            for kind, n in amounts:
                if n > 0:
                    counts[usage_field(name, kind)] += n
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_every_interval())

    def _hashes(self, tenant: str, hour: str) -> list[tuple[str, str, bool]]:
        """(dimension, hash key, hourly) of every hash a request of ``tenant`` adds to this
        hour; built once per tenant and hour (the key names are checked as they are built)."""
        if hour != self._keys_hour:
            self._keys_hour, self._keys = hour, {}
        hashes = self._keys.get(tenant)
        if hashes is None:
            hashes = [
                (dimension, key, hourly)
                for dimension in DIMENSIONS
                for key, hourly in (
                    (day_key(self.keys, tenant, hour[:8], dimension), False),
                    (hour_key(self.keys, tenant, hour, dimension), True),
                )
            ]
            self._keys[tenant] = hashes
        return hashes

    async def _flush_every_interval(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            await self.flush()

    async def flush(self) -> None:
        """Write what accumulated since the last flush, as one pipeline."""
        batch, self._counts = self._counts, {}
        capped, self._capped = self._capped, set()
        hourly, self._hourly = self._hourly, set()
        batch = {key: fields for key, fields in batch.items() if fields}
        if not batch or self.redis is None:
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                pipe = self.redis.pipeline(transaction=False)
                for key, fields in batch.items():
                    ttl = HOURLY_TTL_S if key in hourly else USAGE_TTL_S
                    if key in capped:
                        triples = [
                            (name, kind, amount)
                            for field, amount in fields.items()
                            for name, _, kind in [field.rpartition(":")]
                        ]
                        args = capped_args(self.named_per_bucket, ttl, triples)
                        pipe.eval(CAPPED_INCREMENT, 1, key, *args)
                        continue
                    for field, amount in fields.items():
                        pipe.hincrby(key, field, amount)
                    pipe.expire(key, ttl)
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
