"""Prometheus metrics for the registry, on a per-app registry (tests build many apps).

Framework-free: the fine-tuning dispatcher and service write to it too; the HTTP request
metrics are filled by ``request_metrics.MetricsMiddleware``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class RegistryMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "preft_registry_requests_total",
            "HTTP requests by route and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "preft_registry_request_seconds",
            "HTTP request latency by route",
            ["method", "route"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.store_full = Counter(
            "preft_registry_store_full_total",
            "Writes refused because the object store had no space left (answered 507 store_full)",
            registry=self.registry,
        )
        self.transfers = Gauge(
            "preft_registry_transfers_in_progress",
            "Uploads and downloads this replica is serving (capped by "
            "PREFT_REGISTRY_MAX_TRANSFERS; a tenant's by PREFT_REGISTRY_TENANT_MAX_TRANSFERS)",
            registry=self.registry,
        )
        self.scratch_held = Gauge(
            "preft_registry_scratch_bytes_held",
            "Scratch disk bytes the uploads and downloads in progress hold on this replica "
            "(capped by PREFT_REGISTRY_SCRATCH_BYTES; a tenant's by "
            "PREFT_REGISTRY_TENANT_SCRATCH_BYTES)",
            registry=self.registry,
        )
        self.audit_write_failures = Counter(
            "preft_registry_audit_write_failures_total",
            "Audit log entries that could not be written (the change they describe stands)",
            registry=self.registry,
        )
        # Fine-tuning (registry.finetune): written by the dispatcher and the cancel route.
        self.finetune_jobs = Gauge(
            "preft_registry_finetune_jobs",
            "Fine-tuning jobs queued or running (all "
            "tenants; every registry replica reports the same numbers)",
            ["state"],
            registry=self.registry,
        )
        self.finetune_finished = Counter(
            "preft_registry_finetune_jobs_finished_total",
            "Fine-tuning jobs finished, by status (succeeded, failed, cancelled)",
            ["status"],
            registry=self.registry,
        )
        self.finetune_tokens = Counter(
            "preft_registry_finetune_trained_tokens_total",
            "Tokens trained on by succeeded fine-tuning jobs",
            registry=self.registry,
        )
