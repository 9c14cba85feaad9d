"""The gateway's shared clients and background loops, created once in the app's lifespan."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
import redis.asyncio as aioredis

from preft_serve.common.registry_client import AsyncRegistryClient, AsyncRegistryReader
from preft_serve.common.registry_client.aio import connect_redis
from preft_serve.common.tenant_rate_limits import RATE_LIMIT_FIELDS
from preft_serve.common.tracing import instrument_client
from preft_serve.gateway.context_window import ContextWindow
from preft_serve.gateway.discovery import WorkerSource, create_decode_source, create_source
from preft_serve.gateway.metrics import GatewayMetrics
from preft_serve.gateway.pool_monitor import WorkerMonitor
from preft_serve.gateway.ratelimit import RateLimiter
from preft_serve.gateway.registry_proxy import RegistryForwarder, registry_http
from preft_serve.gateway.routing import WorkerPool, pool_from_settings
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.gateway.tenant_serving import TenantServing
from preft_serve.gateway.upstream import Calls, WorkerTransport, worker_calls
from preft_serve.gateway.usage import UsageRecorder
from preft_serve.gateway.validation import Caps

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

# How long an idle connection to a worker is kept for reuse. Shorter than the workers' own
# keep-alive timeout (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s), so the gateway never sends
# a request on a connection the worker is closing at that moment: with both at 5 s (httpx's
# default), the soak saw that race answer single requests with 502 "ReadError" from a
# healthy worker.
WORKER_KEEPALIVE_S = 2.0
CONNECTION_HEADROOM = 256
"""Connections to workers beyond ``max_open_requests``: health and residency checks never
wait behind completions for one."""


@dataclass
class GatewayState:
    settings: GatewaySettings
    registry: AsyncRegistryReader
    # The gateway's own Redis handle (readiness, rate limits; the registry client shares
    # its pool). None only when a test passes a registry without one: no rate limits then.
    redis: aioredis.Redis | None
    http: httpx.AsyncClient  # health checks
    calls: Calls  # completions, on the same transport (without httpx where it can)
    pool: WorkerPool
    monitor: WorkerMonitor
    limiter: RateLimiter
    metrics: GatewayMetrics
    caps: Caps
    usage: UsageRecorder
    serving: TenantServing  # tenants' serving settings (unbound_user)
    owns_redis: bool = False
    # The decode pool (workers with --role decode; no adapters), when configured.
    decode_pool: WorkerPool | None = None
    decode_monitor: WorkerMonitor | None = None
    # Unix seconds this gateway started: the base model's ``created`` in /v1/models.
    started_at: int = dataclasses.field(default_factory=lambda: int(time.time()))
    # Files and fine-tuning calls go to the registry on it (None: no registry configured).
    registry_http: RegistryForwarder | None = None

    @classmethod
    async def build(
        cls,
        settings: GatewaySettings,
        metrics: GatewayMetrics,
        transport: httpx.AsyncBaseTransport | None = None,
        registry: AsyncRegistryReader | None = None,
        source: WorkerSource | None = None,
        redis: aioredis.Redis | None = None,
        tracer_provider: TracerProvider | None = None,
        decode_source: WorkerSource | None = None,
    ) -> GatewayState:
        """Start the registry client (waits for its event listener), find the workers and
        check them once, then keep doing so in the background. ``registry`` and ``redis``
        replace the real ones (tests). With ``tracer_provider`` (tracing on) a call to a worker
        for a request is a client span in its trace and carries its ``traceparent``."""
        owns_redis = registry is None and redis is None
        if registry is None:
            if redis is None:
                redis = connect_redis(settings.redis_url)
            client = AsyncRegistryClient(
                client=redis,
                namespace=settings.namespace,
                max_cache_entries=settings.registry_cache_entries,
            )
            await client.start()
            registry = client
        metrics.watch_registry_cache(registry.cache_sizes)
        timeout = httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s)
        transport = transport or WorkerTransport(
            settings.max_open_requests + CONNECTION_HEADROOM, WORKER_KEEPALIVE_S
        )
        http = httpx.AsyncClient(timeout=timeout, transport=transport)
        if tracer_provider is not None:
            instrument_client(http, tracer_provider)
        pool = pool_from_settings(settings)
        context = ContextWindow()
        monitor = WorkerMonitor(
            pool,
            source or create_source(settings),
            http,
            metrics,
            discovery_interval_s=settings.discovery_interval_s,
            health_interval_s=settings.health_interval_s,
            load_interval_s=settings.load_poll_interval_s,
            context=context,
        )
        limiter = RateLimiter(
            redis,
            settings.namespace,
            metrics,
            settings.model_dump(include=set(RATE_LIMIT_FIELDS)),
            settings.limits_cache_s,
            settings.ratelimit_timeout_s,
        )
        caps = Caps(
            max_tokens=settings.max_tokens_cap,
            max_request_tokens=settings.max_request_tokens,
            max_choices=settings.max_choices,
            max_prompts=settings.max_prompts,
            max_prompt_token_ids=settings.max_prompt_token_ids,
            max_json_depth=settings.max_json_depth,
            context=context,
        )
        usage = UsageRecorder(redis, settings.namespace, metrics, settings.usage_timeout_s)
        serving = TenantServing(
            redis, settings.namespace, settings.limits_cache_s, settings.ratelimit_timeout_s
        )
        await monitor.start()
        decode_pool, decode_monitor = None, None
        decode_source = decode_source or create_decode_source(settings)
        if decode_source is not None:
            decode_pool = pool_from_settings(settings, decode=True)
            # One share per tenant across both pools: a two-pool stream is its decode hop.
            decode_pool.tenant_open = pool.tenant_open
            decode_monitor = WorkerMonitor(
                decode_pool,
                decode_source,
                http,
                metrics,
                discovery_interval_s=settings.discovery_interval_s,
                health_interval_s=settings.health_interval_s,
                load_interval_s=settings.load_poll_interval_s,
                gauge=metrics.decode_workers,
                context=context,
            )
            await decode_monitor.start()
        calls = worker_calls(transport, timeout, traced=tracer_provider is not None)
        return cls(
            settings,
            registry,
            redis,
            http,
            calls,
            pool,
            monitor,
            limiter,
            metrics,
            caps,
            usage,
            serving,
            owns_redis,
            decode_pool=decode_pool,
            decode_monitor=decode_monitor,
            registry_http=registry_http(settings, metrics),
        )

    async def aclose(self) -> None:
        await self.usage.drain()
        await self.monitor.aclose()
        if self.decode_monitor is not None:
            await self.decode_monitor.aclose()
        await self.http.aclose()
        if self.registry_http is not None:
            await self.registry_http.aclose()
        await self.registry.aclose()
        if self.owns_redis and self.redis is not None:
            await self.redis.aclose()
