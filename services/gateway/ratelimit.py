"""Per-tenant and per-user request rate limits: token buckets kept in Redis.

The buckets live in the registry's Redis so every gateway replica shares them. One Lua
script checks the tenant's and the user's bucket together and takes a token from both or
from neither (a request refused by the user limit does not eat the tenant's budget). The
clock is Redis's own ``TIME``, so replicas with skewed clocks agree. The limits are the
gateway's defaults (``PREFT_GATEWAY_TENANT_RPS`` ...) unless the registry holds overrides
for the tenant (``PUT /v1/tenants/{tenant}/limits``, admin), read through a short cache.

If Redis is unreachable the limiter lets requests through (and counts the failure): the
gateway can keep serving users whose bindings it has cached, and refusing all traffic
because the limiter's store is down would turn a Redis blip into an outage.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis
from preft_serve.common.errors import TooManyRequests
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.gateway.metrics import GatewayMetrics

logger = logging.getLogger(__name__)

# KEYS[i]: bucket hash {t: tokens, ts: ms}. ARGV[2i-1]: refill tokens per ms, ARGV[2i]: size.
# Returns {1, 0, 0} when a token was taken from every bucket, else {0, wait_ms, i} for the
# bucket that needs the longest wait.
TOKEN_BUCKET_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local levels = {}
local wait, which = 0, 0
for i = 1, #KEYS do
  local rate, size = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local state = redis.call('HMGET', KEYS[i], 't', 'ts')
  local tokens, ts = tonumber(state[1]), tonumber(state[2])
  if tokens == nil or ts == nil then tokens, ts = size, now end
  tokens = math.min(size, tokens + math.max(0, now - ts) * rate)
  levels[i] = tokens
  if tokens < 1 then
    local need = math.ceil((1 - tokens) / rate)
    if need > wait then wait, which = need, i end
  end
end
if wait > 0 then return {0, wait, which} end
for i = 1, #KEYS do
  local rate, size = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  redis.call('HSET', KEYS[i], 't', tostring(levels[i] - 1), 'ts', now)
  redis.call('PEXPIRE', KEYS[i], math.ceil(size / rate) + 1000)
end
return {1, 0, 0}
"""


@dataclass(frozen=True)
class Limit:
    """``rate`` requests per second sustained, ``burst`` at once."""

    rate: float
    burst: int

    @classmethod
    def of(cls, rate: float, burst: int) -> Limit | None:
        if rate <= 0:
            return None
        return cls(rate, burst or max(1, math.ceil(2 * rate)))


LIMIT_FIELDS = ("tenant_rps", "tenant_burst", "user_rps", "user_burst")


class RateLimiter:
    """Token buckets with the gateway's default limits, overridden per tenant by the
    registry (``PUT /v1/tenants/{tenant}/limits``; read at most every ``cache_s``)."""

    def __init__(self, client: aioredis.Redis | None, namespace: str, metrics: GatewayMetrics,
                 defaults: dict[str, float], cache_s: float = 10.0) -> None:
        self.redis, self.namespace, self.metrics = client, namespace, metrics
        self.keys = RegistryKeys(namespace)
        self.defaults = {f: float(defaults.get(f, 0)) for f in LIMIT_FIELDS}
        self.cache_s = cache_s
        self._overrides: dict[str, tuple[float, dict[str, float]]] = {}
        # Without a client (a test double of the registry) there are no limits at all.
        self._script = client.register_script(TOKEN_BUCKET_LUA) if client is not None else None

    async def limits(self, tenant: str) -> tuple[Limit | None, Limit | None]:
        """(tenant limit, per-user limit) for ``tenant``: defaults + its overrides."""
        values = {**self.defaults, **await self._tenant_overrides(tenant)}
        return (Limit.of(values["tenant_rps"], int(values["tenant_burst"])),
                Limit.of(values["user_rps"], int(values["user_burst"])))

    async def _tenant_overrides(self, tenant: str) -> dict[str, float]:
        now = time.monotonic()
        cached = self._overrides.get(tenant)
        if cached is not None and cached[0] > now:
            return cached[1]
        assert self.redis is not None
        try:
            raw = await self.redis.hgetall(self.keys.tenant_limits(tenant))
        except redis.RedisError:
            return cached[1] if cached is not None else {}
        fields = {_text(k): float(_text(v)) for k, v in raw.items()
                  if _text(k) in LIMIT_FIELDS}
        self._overrides[tenant] = (now + self.cache_s, fields)
        return fields

    async def check(self, tenant: str, user: str | None) -> None:
        """Take one request from the tenant's and the user's bucket, or raise 429."""
        if self._script is None:
            return
        try:
            tenant_limit, user_limit = await self.limits(tenant)
        except ValueError:  # a malformed override: log it and use no limit rather than 500
            logger.exception("tenant %s has malformed rate-limit overrides", tenant)
            return
        buckets: list[tuple[str, str, Limit]] = []
        if tenant_limit is not None:
            buckets.append(("tenant", f"{self.namespace}:ratelimit:tenant:{tenant}",
                            tenant_limit))
        if user_limit is not None and user is not None:
            buckets.append(("user", f"{self.namespace}:ratelimit:user:{tenant}:{user}",
                            user_limit))
        if not buckets:
            return
        args: list[float | int] = []
        for _, _, limit in buckets:
            args += [limit.rate / 1000.0, limit.burst]
        try:
            allowed, wait_ms, which = await self._script(keys=[k for _, k, _ in buckets],
                                                         args=args)
        except redis.RedisError as exc:
            logger.warning("rate limiter unavailable, letting the request through: %s", exc)
            self.metrics.errors.labels("rate_limit_unavailable").inc()
            return
        if allowed:
            return
        scope, _, limit = buckets[int(which) - 1]
        self.metrics.rate_limited.labels(scope).inc()
        retry_after = max(1, math.ceil(int(wait_ms) / 1000))
        who = f"tenant {tenant}" if scope == "tenant" else f"user {user}"
        raise TooManyRequests(
            f"rate limit exceeded for {who}: {limit.rate:g} requests/s with bursts of "
            f"{limit.burst}; retry after {retry_after} s",
            headers={"Retry-After": str(retry_after)})


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
