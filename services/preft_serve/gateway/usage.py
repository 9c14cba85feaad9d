"""Per tenant usage counters in Redis (read by the registry's ``GET /v1/usage``).

Each request a worker answered with 200 adds one to ``{model}:requests`` and its token counts
to ``{model}:prompt_tokens`` / ``{model}:completion_tokens`` of the hash
``RegistryKeys.usage(tenant, day)``, kept ``USAGE_TTL_S``, and the same counts to the
per-user, per-key and per-hour hashes of ``common.usage_breakdown`` (bounded there). The
per-version hashes also count requests that failed after a version was chosen, and the time
to first token of streamed ones (sum and count).
Requests only add to counts in memory (one row per tenant, hour, model, user, key and version,
spread over the hashes at flush time); a background task writes what accumulated once per
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

from preft_serve.common.registry_client import (
    USAGE_KINDS,
    USAGE_TTL_S,
    RegistryKeys,
    is_user_id,
    usage_field,
)
from preft_serve.common.usage_breakdown import (
    CAPPED,
    CAPPED_INCREMENT,
    DIMENSIONS,
    HOURLY_TTL_S,
    NAMED_PER_BUCKET,
    NO_USER,
    OTHER,
    VERSION_KINDS,
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
ROW_KINDS = VERSION_KINDS  # requests, prompt and completion tokens, errors, TTFT sum, count


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
        # What requests added since the last flush: one row per tenant, hour, model, user,
        # key and version, holding the amounts of ROW_KINDS; spread over the hashes at flush.
        self._rows: dict[tuple[str, str, str, str, str, str], list[int]] = {}
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
        version: str | None = None,
        errors: int = 0,
        ttft_s: float | None = None,
    ) -> None:
        """Add to the counts; returns at once (the next flush writes them). ``user``: the
        request's user id (None: it named none); ``key_id``: the id of the key it used;
        ``version``: what served (``name@version``; None: ``model``), whose hashes also
        count ``errors`` and the time to first token ``ttft_s`` (None: not streamed)."""
        if self.redis is None:
            return
        row = (
            tenant,
            self._hour(),
            model,
            user if user is not None and is_user_id(user) else NO_USER,
            key_id or OTHER,
            version or model,
        )
        amounts = self._rows.get(row)
        if amounts is None:
            amounts = self._rows[row] = [0] * len(ROW_KINDS)
        amounts[0] += requests
        amounts[1] += prompt_tokens
        amounts[2] += completion_tokens
        amounts[3] += errors
        if ttft_s is not None:
            amounts[4] += max(1, round(ttft_s * 1e6))
            amounts[5] += 1
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_every_interval())

    def _batch(
        self, rows: dict[tuple[str, str, str, str, str, str], list[int]]
    ) -> tuple[dict[str, Counter[str]], set[str], set[str]]:
        """The rows spread over the hashes they add to: hash key -> field -> amount; the
        keys of the capped hashes; those of the hourly ones."""
        batch: dict[str, Counter[str]] = {}
        capped: set[str] = set()
        hourly: set[str] = set()
        for (tenant, hour, model, user, key_id, version), amounts in rows.items():
            names = {"model": model, "user": user, "key": key_id, "version": version}
            try:
                hashes = self._hashes(tenant, hour)
            except ValueError as exc:  # not a tenant name a key could hold: not counted
                logger.warning("usage of %r not counted: %s", tenant, exc)
                continue
            for dimension, key, is_hourly in hashes:
                counts = batch.setdefault(key, Counter())
                if dimension in CAPPED:
                    capped.add(key)
                if is_hourly:
                    hourly.add(key)
                name = names[dimension]
                kinds = ROW_KINDS if dimension == "version" else USAGE_KINDS
                for kind, n in zip(kinds, amounts, strict=False):
                    if n > 0:
                        counts[usage_field(name, kind)] += n
        return batch, capped, hourly

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
        rows, self._rows = self._rows, {}
        batch, capped, hourly = self._batch(rows)
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
