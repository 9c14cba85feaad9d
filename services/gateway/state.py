"""The gateway's shared clients, created once in the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from preft_serve.common.registry_client import AsyncRegistryClient, RegistryKeys
from preft_serve.gateway.metrics import GatewayMetrics
from preft_serve.gateway.routing import WorkerPool
from preft_serve.gateway.settings import GatewaySettings


@dataclass
class GatewayState:
    settings: GatewaySettings
    registry: AsyncRegistryClient
    http: httpx.AsyncClient
    pool: WorkerPool
    metrics: GatewayMetrics

    @property
    def keys(self) -> RegistryKeys:
        return RegistryKeys(self.settings.namespace)

    @classmethod
    async def build(cls, settings: GatewaySettings, metrics: GatewayMetrics,
                    transport: httpx.AsyncBaseTransport | None = None,
                    registry: AsyncRegistryClient | None = None) -> GatewayState:
        """Start the registry client (waits for its event listener) and the worker pool."""
        if registry is None:
            registry = AsyncRegistryClient(settings.redis_url, namespace=settings.namespace)
            await registry.start()
        timeout = httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s)
        http = httpx.AsyncClient(timeout=timeout, transport=transport,
                                 limits=httpx.Limits(max_connections=1000,
                                                     max_keepalive_connections=100))
        return cls(settings, registry, http, WorkerPool(settings.worker_urls,
                                                        settings.load_factor), metrics)

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.registry.aclose()
