"""Per-tenant and per-user rate limits: token buckets kept in Redis.

Two kinds of bucket, each per tenant and per (tenant, user): *requests* (one per request,
``PREFT_GATEWAY_TENANT_RPS`` ...) and *output tokens* per minute (``PREFT_GATEWAY_TENANT_TPM``
...), charged up front with what the request may generate: ``prompts x max(n, best_of) x
max_tokens``. The buckets live in the registry's Redis so every gateway replica shares
them. One Lua script checks all of a request's buckets together and charges every one of
them or none (a request refused by the user's token limit does not eat the tenant's
budget). The clock is Redis's own ``TIME``, so replicas with skewed clocks agree. The limits
are the gateway's defaults unless the registry holds overrides for the tenant
(``PUT /v1/tenants/{tenant}/limits``, admin), read through a short cache.

If Redis is unreachable or slower than ``PREFT_GATEWAY_RATELIMIT_TIMEOUT_S``, the limiter
lets requests through (and counts the failure): the gateway can keep serving users whose
bindings it has cached, and refusing or stalling all traffic because the limiter's store is
down would turn a Redis blip into an outage.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis

from preft_serve.common.errors import TooManyRequests
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.common.tenant_rate_limits import RATE_LIMIT_FIELDS
from preft_serve.gateway.metrics import GatewayMetrics

logger = logging.getLogger(__name__)

# KEYS[i]: bucket hash {t: tokens, ts: ms}. ARGV[3i-2]: refill per ms, ARGV[3i-1]: size,
# ARGV[3i]: cost. Returns {1, 0, 0} when every bucket was charged, else {0, wait_ms, i} for
# the bucket that needs the longest wait (nothing is charged then).
TOKEN_BUCKET_LUA = """
-- A bucket that refills slower than this expires (full) first. Unbounded, a tiny rate
-- made a TTL like 1e+16, which Lua passes as "1e+16": PEXPIRE refused it, the script
-- failed after writing the bucket, and the request went through as in a Redis outage.
local MAX_TTL_MS = 34560000000  -- 400 days
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local levels = {}
local wait, which = 0, 0
for i = 1, #KEYS do
  local rate, size, cost = tonumber(ARGV[3*i-2]), tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i])
  local state = redis.call('HMGET', KEYS[i], 't', 'ts')
  local tokens, ts = tonumber(state[1]), tonumber(state[2])
  if tokens == nil or ts == nil then tokens, ts = size, now end
  tokens = math.min(size, tokens + math.max(0, now - ts) * rate)
  levels[i] = tokens
  if tokens < cost then
    local need = math.ceil((cost - tokens) / rate)
    if need > wait then wait, which = need, i end
  end
end
if wait > 0 then return {0, wait, which} end
for i = 1, #KEYS do
  local rate, size, cost = tonumber(ARGV[3*i-2]), tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i])
  redis.call('HSET', KEYS[i], 't', tostring(levels[i] - cost), 'ts', now)
  redis.call('PEXPIRE', KEYS[i], math.min(math.ceil(size / rate), MAX_TTL_MS) + 1000)
end
return {1, 0, 0}
"""


@dataclass(frozen=True)
class Limit:
    """``rate`` per second sustained, ``burst`` at once; ``describe`` is for messages."""

    rate: float
    burst: int
    describe: str

    @classmethod
    def requests(cls, rate: float, burst: int) -> Limit | None:
        if rate <= 0:
            return None
        burst = burst or max(1, math.ceil(2 * rate))
        return cls(rate, burst, f"{rate:g} requests/s with bursts of {burst}")

    @classmethod
    def tokens_per_minute(cls, tpm: float) -> Limit | None:
        """A bucket holding one minute's worth of output tokens."""
        if tpm <= 0:
            return None
        return cls(tpm / 60.0, max(1, math.floor(tpm)), f"{tpm:g} output tokens/minute")


@dataclass(frozen=True)
class Bucket:
    scope: str  # tenant | user | tenant_tokens | user_tokens (the metric's label)
    key: str
    limit: Limit
    cost: int


class RateLimiter:
    """Token buckets with the gateway's default limits, overridden per tenant by the
    registry (``PUT /v1/tenants/{tenant}/limits``; read at most every ``cache_s``)."""

    def __init__(
        self,
        client: aioredis.Redis | None,
        namespace: str,
        metrics: GatewayMetrics,
        defaults: dict[str, float],
        cache_s: float = 10.0,
        timeout_s: float = 0.2,
    ) -> None:
        self.redis, self.namespace, self.metrics = client, namespace, metrics
        self.keys = RegistryKeys(namespace)
        self.defaults = {f: float(defaults.get(f, 0)) for f in RATE_LIMIT_FIELDS}
        self.cache_s, self.timeout_s = cache_s, timeout_s
        self._overrides: dict[str, tuple[float, dict[str, float]]] = {}
        self._unavailable = False  # log outages once, not once per request
        # Without a client (a test double of the registry) there are no limits at all.
        self._script = client.register_script(TOKEN_BUCKET_LUA) if client is not None else None

    async def limits(self, tenant: str) -> dict[str, Limit]:
        """The limits in force for ``tenant`` by scope: defaults + its overrides."""
        values = {**self.defaults, **await self._tenant_overrides(tenant)}
        found = {
            "tenant": Limit.requests(values["tenant_rps"], int(values["tenant_burst"])),
            "user": Limit.requests(values["user_rps"], int(values["user_burst"])),
            "tenant_tokens": Limit.tokens_per_minute(values["tenant_tpm"]),
            "user_tokens": Limit.tokens_per_minute(values["user_tpm"]),
        }
        return {scope: limit for scope, limit in found.items() if limit is not None}

    async def _tenant_overrides(self, tenant: str) -> dict[str, float]:
        now = time.monotonic()
        cached = self._overrides.get(tenant)
        if cached is not None and cached[0] > now:
            return cached[1]
        assert self.redis is not None
        try:
            raw = await self.redis.hgetall(self.keys.tenant_rate_limits(tenant))
        except redis.RedisError:
            return cached[1] if cached is not None else {}
        fields = {
            _text(k): float(_text(v)) for k, v in raw.items() if _text(k) in RATE_LIMIT_FIELDS
        }
        self._overrides[tenant] = (now + self.cache_s, fields)
        return fields

    async def _buckets(self, tenant: str, user: str | None, tokens: int) -> list[Bucket]:
        try:
            limits = await self.limits(tenant)
        except ValueError:  # a malformed override: log it and use no limit rather than 500
            logger.exception("tenant %s has malformed rate-limit overrides", tenant)
            return []
        buckets: list[Bucket] = []
        for scope, limit in limits.items():
            owner, _, kind = scope.partition("_")
            if owner == "user" and user is None:
                continue
            name = f"{owner}-tokens" if kind else owner
            key = self.keys.rate_limit(name, tenant, user if owner == "user" else None)
            buckets.append(Bucket(scope, key, limit, tokens if kind else 1))
        return buckets

    async def check(self, tenant: str, user: str | None, tokens: int = 1) -> None:
        """Charge one request and ``tokens`` output tokens to the tenant's and the user's
        buckets, or raise 429 (charging nothing)."""
        if self._script is None:
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                buckets = await self._buckets(tenant, user, tokens)
                for bucket in buckets:
                    if bucket.cost > bucket.limit.burst:
                        self._refuse(bucket, tenant, user, None)
                if not buckets:
                    return
                args: list[float | int] = []
                for bucket in buckets:
                    args += [bucket.limit.rate / 1000.0, bucket.limit.burst, bucket.cost]
                allowed, wait_ms, which = await self._script(
                    keys=[b.key for b in buckets], args=args
                )
        except (redis.RedisError, TimeoutError) as exc:
            if not self._unavailable:
                logger.warning(
                    "rate limiter unavailable, letting requests through until "
                    "Redis answers within %g s: %r",
                    self.timeout_s,
                    exc,
                )
            self._unavailable = True
            self.metrics.errors.labels("rate_limit_unavailable").inc()
            return
        if self._unavailable:
            logger.info("rate limiter available again")
            self._unavailable = False
        if not allowed:
            self._refuse(buckets[int(which) - 1], tenant, user, int(wait_ms))

    def _refuse(self, bucket: Bucket, tenant: str, user: str | None, wait_ms: int | None) -> None:
        self.metrics.rate_limited.labels(bucket.scope).inc()
        who = f"tenant {tenant}" if bucket.scope.startswith("tenant") else f"user {user}"
        if wait_ms is None:  # more than the bucket ever holds: waiting cannot help
            raise TooManyRequests(
                f"this request reserves {bucket.cost} output tokens (prompts x n x "
                f"max_tokens), more than the whole budget of {who} ({bucket.limit.describe}); "
                "lower max_tokens or n"
            )
        retry_after = max(1, math.ceil(wait_ms / 1000))
        if bucket.scope.endswith("_tokens"):
            message = (
                f"token rate limit exceeded for {who}: this request reserves "
                f"{bucket.cost} output tokens (prompts x n x max_tokens) of "
                f"{bucket.limit.describe}"
            )
        else:
            message = f"rate limit exceeded for {who}: {bucket.limit.describe}"
        raise TooManyRequests(
            f"{message}; retry after {retry_after} s", headers={"Retry-After": str(retry_after)}
        )


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
