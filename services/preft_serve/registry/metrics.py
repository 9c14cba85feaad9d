"""Prometheus metrics for the registry, on a per-app registry (tests build many apps)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class RegistryMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "preft_registry_requests_total", "HTTP requests by route and status",
            ["method", "route", "status"], registry=self.registry,
        )
        self.latency = Histogram(
            "preft_registry_request_seconds", "HTTP request latency by route",
            ["method", "route"], registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.store_full = Counter(
            "preft_registry_store_full_total", "Writes refused because the object store "
            "had no space left (answered 507 store_full)", registry=self.registry)
        # Fine-tuning (registry.finetune): written by the dispatcher and the cancel route.
        self.finetune_jobs = Gauge(
            "preft_registry_finetune_jobs", "Fine-tuning jobs queued or running (all "
            "tenants; every registry replica reports the same numbers)", ["state"],
            registry=self.registry)
        self.finetune_finished = Counter(
            "preft_registry_finetune_jobs_finished_total", "Fine-tuning jobs finished, by "
            "status (succeeded, failed, cancelled)", ["status"], registry=self.registry)
        self.finetune_tokens = Counter(
            "preft_registry_finetune_trained_tokens_total", "Tokens trained on by "
            "succeeded fine-tuning jobs", registry=self.registry)


class MetricsMiddleware:
    """Counts and times requests, labelled by route template (bounded cardinality)."""

    def __init__(self, app: ASGIApp, metrics: RegistryMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            method = scope["method"]
            self.metrics.requests.labels(method, route, str(status)).inc()
            self.metrics.latency.labels(method, route).observe(time.perf_counter() - start)
