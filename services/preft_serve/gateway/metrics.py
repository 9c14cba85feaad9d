"""Prometheus metrics for the gateway, on a per-app registry (tests build many apps).

Label cardinality is bounded: the first ``max_adapters`` distinct adapter names seen since
start-up get their own ``adapter`` label, every later one is counted as ``other``; tenants
likewise (``max_tenants``). (First seen rather than "top N by traffic": a ranking would move
series between labels and make counters non-monotonic per label.) The base model is labelled
with its public name.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

OTHER = "other"
REGISTRY_CACHES = ("users", "adapters", "api_keys", "blobs")
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class BoundedLabels:
    """The first ``limit`` distinct names keep their own label value; later ones: ``other``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._named: set[str] = set()

    def __call__(self, name: str) -> str:
        if name in self._named:
            return name
        if len(self._named) < self.limit:
            self._named.add(name)
            return name
        return OTHER


class Children:
    """A labelled metric's children by label values, looked up in a plain dict.

    ``metric.labels(...)`` validates, converts every value with ``str`` and takes a lock
    on each call: ~3 µs, and a completion made nine such calls (the gateway's CPU per
    request: docs/benchmarks.md). The values reaching here are already bounded (see
    :class:`BoundedLabels`; status codes and route results are few), so the dict is too.
    """

    def __init__(self, metric: Counter | Histogram) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        """The child for ``values`` (a ``Counter`` or ``Histogram`` like the metric)."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class GatewayMetrics:
    def __init__(self, max_adapters: int = 100, max_tenants: int = 100) -> None:
        self.registry = CollectorRegistry()
        self.max_adapters = max_adapters
        self._adapters = BoundedLabels(max_adapters)
        self.tenant_label = BoundedLabels(max_tenants)
        self.requests = Counter(
            "preft_gateway_requests_total",
            "Completion requests by adapter and HTTP status",
            ["adapter", "status"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "preft_gateway_prompt_tokens_total",
            "Prompt tokens reported by workers",
            ["adapter"],
            registry=self.registry,
        )
        self.generation_tokens = Counter(
            "preft_gateway_generation_tokens_total",
            "Generated tokens reported by workers",
            ["adapter"],
            registry=self.registry,
        )
        self.tenant_requests = Counter(
            "preft_gateway_tenant_requests_total",
            "Completion requests of authenticated "
            "tenants by HTTP status (429s and other refusals included)",
            ["tenant", "status"],
            registry=self.registry,
        )
        self.tenant_tokens = Counter(
            "preft_gateway_tenant_tokens_total",
            "Tokens reported by workers per tenant; kind: prompt or completion",
            ["tenant", "kind"],
            registry=self.registry,
        )
        self.usage_write_failures = Counter(
            "preft_gateway_usage_write_failures_total",
            "Per-day usage counters that could "
            "not be written to Redis (error or slower than the usage timeout)",
            registry=self.registry,
        )
        self.latency = Histogram(
            "preft_gateway_request_seconds",
            "Completion request latency (to the last byte) of requests a worker answered",
            ["adapter"],
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        self.ttft = Histogram(
            "preft_gateway_ttft_seconds",
            "Time to first token of streamed completions: from "
            "the request's arrival to the first generated text sent to the client",
            ["adapter"],
            registry=self.registry,
            buckets=TTFT_BUCKETS,
        )
        self.variant_requests = Counter(
            "preft_gateway_adapter_variant_requests_total",
            "Completion requests to adapters by "
            "which part of the adapter's serving policy chose the version: serving (the "
            "policy's version), canary (a user in its canary split) or pinned (name@version)",
            ["adapter", "variant"],
            registry=self.registry,
        )
        # A canary is judged by its requests' outcomes beside the serving version's: the
        # same measures as the per-adapter families, split by the serving policy's variant
        # (three values, so at most 3x the bounded adapter label's series).
        self.variant_outcomes = Counter(
            "preft_gateway_adapter_variant_outcomes_total",
            "Completion requests to adapters by "
            "serving-policy variant and outcome (ok: 2xx, client_error: 4xx, "
            "server_error: 5xx), counted once when the request ends",
            ["adapter", "variant", "outcome"],
            registry=self.registry,
        )
        self.variant_output_tokens = Counter(
            "preft_gateway_adapter_variant_output_tokens_total",
            "Generated tokens reported by workers, by adapter and serving-policy variant",
            ["adapter", "variant"],
            registry=self.registry,
        )
        self.variant_ttft = Histogram(
            "preft_gateway_adapter_variant_ttft_seconds",
            "Time to first token of streamed "
            "completions to adapters, by adapter and serving-policy variant",
            ["adapter", "variant"],
            registry=self.registry,
            buckets=TTFT_BUCKETS,
        )
        self.rate_limited = Counter(
            "preft_gateway_rate_limited_total",
            "Requests refused with 429 by a rate limit",
            ["scope"],
            registry=self.registry,
        )
        self.workers = Gauge(
            "preft_gateway_workers",
            "Workers known to this gateway by health state",
            ["state"],
            registry=self.registry,
        )
        self.decode_workers = Gauge(
            "preft_gateway_decode_workers",
            "Decode-pool workers (no adapters) known to this gateway by health state",
            ["state"],
            registry=self.registry,
        )
        self.handoffs = Counter(
            "preft_gateway_handoffs_total",
            "Requests served by the two pools: decoded (the "
            "decode pool continued it), first_token (it ended at its first token, no decode "
            "hop), fallback (no decode worker reachable, or a stop string could span the "
            "hops: served whole by the prefill pool), "
            "decode_failed (the decode hop failed after the prefill)",
            ["result"],
            registry=self.registry,
        )
        self.unified = Counter(
            "preft_gateway_unified_total",
            "Requests a gateway with a decode pool served "
            "whole on one worker, by why: all_token_adapter, one_token, option (a field "
            "whose meaning spans both hops: n, logprobs, tools, structured output...)",
            ["reason"],
            registry=self.registry,
        )
        self.handoff_seconds = Histogram(
            "preft_gateway_handoff_seconds",
            "From the prefill worker's answer to the decode "
            "worker's first byte: KV transfer plus the decode worker's queue",
            registry=self.registry,
            buckets=TTFT_BUCKETS,
        )
        self.routing = Counter(
            "preft_gateway_routing_total",
            "Routing decisions: the adapter's own worker "
            "(resident, preferred), one of a hot adapter's replicas (replica) or the next "
            "one because of the load cap (spill)",
            ["result"],
            registry=self.registry,
        )
        self.errors = Counter(
            "preft_gateway_errors_total",
            "Failed requests by cause",
            ["cause"],
            registry=self.registry,
        )
        self.registry_calls = Gauge(
            "preft_gateway_registry_calls",
            "Files and fine-tuning calls this gateway has "
            "open to the registry: uploads, and the others",
            ["kind"],
            registry=self.registry,
        )
        self.registry_cache = Gauge(
            "preft_gateway_registry_cache_entries",
            "Entries in the registry client's lookup "
            "caches (bounded by PREFT_GATEWAY_REGISTRY_CACHE_ENTRIES each)",
            ["cache"],
            registry=self.registry,
        )
        # The per-request series, through cached children (see Children).
        self._requests = Children(self.requests)
        self._tenant_requests = Children(self.tenant_requests)
        self._prompt_tokens = Children(self.prompt_tokens)
        self._generation_tokens = Children(self.generation_tokens)
        self._tenant_tokens = Children(self.tenant_tokens)
        self.latency_of, self.ttft_of = Children(self.latency), Children(self.ttft)
        self.routing_of, self.errors_of = Children(self.routing), Children(self.errors)
        self.variant_of = Children(self.variant_requests)
        self._variant_outcomes = Children(self.variant_outcomes)
        self._variant_output_tokens = Children(self.variant_output_tokens)
        self._variant_ttft = Children(self.variant_ttft)

    def watch_registry_cache(self, sizes: Callable[[], dict[str, int]]) -> None:
        """Read the cache sizes at every scrape."""
        for name in REGISTRY_CACHES:
            self.registry_cache.labels(name).set_function(partial(_entries, sizes, name))

    def watch_registry_calls(self, uploads: Callable[[], int], others: Callable[[], int]) -> None:
        """Read the open forwarded calls at every scrape."""
        self.registry_calls.labels("upload").set_function(uploads)
        self.registry_calls.labels("other").set_function(others)

    def adapter_label(self, name: str) -> str:
        """``name`` while under the cardinality budget, else ``other``."""
        return self._adapters(name)

    def record_request(self, tenant_label: str, label: str, status: int) -> None:
        code = str(status)
        self._requests(label, code).inc()
        self._tenant_requests(tenant_label, code).inc()

    def record_tokens(
        self,
        label: str,
        prompt: int | None,
        completion: int | None,
        tenant_label: str | None = None,
    ) -> None:
        """Add a request's token counts (None: not known)."""
        if prompt is not None:
            self._prompt_tokens(label).inc(prompt)
            if tenant_label is not None:
                self._tenant_tokens(tenant_label, "prompt").inc(prompt)
        if completion is not None:
            self._generation_tokens(label).inc(completion)
            if tenant_label is not None:
                self._tenant_tokens(tenant_label, "completion").inc(completion)

    def record_variant(
        self, label: str, variant: str, status: int, completion: int | None, ttft: float | None
    ) -> None:
        """Count an adapter request's end under the policy's ``variant`` that served it:
        its outcome by ``status``, its generated tokens (None: not known) and its time to
        first token (None: not streamed, or no text was sent)."""
        self._variant_outcomes(label, variant, outcome_of(status)).inc()
        if completion is not None:
            self._variant_output_tokens(label, variant).inc(completion)
        if ttft is not None:
            self._variant_ttft(label, variant).observe(ttft)


def outcome_of(status: int) -> str:
    """A status's outcome label: ``ok`` below 400, ``client_error`` for 4xx, else
    ``server_error``."""
    if status < 400:
        return "ok"
    return "client_error" if status < 500 else "server_error"


def token_counts(usage: object) -> tuple[int | None, int | None]:
    """``(prompt_tokens, completion_tokens)`` of an OpenAI ``usage`` object; None for a
    missing or malformed count."""
    if not isinstance(usage, dict):
        return None, None
    counts = [usage.get(f) for f in ("prompt_tokens", "completion_tokens")]
    prompt, completion = (
        c if isinstance(c, int) and not isinstance(c, bool) and c >= 0 else None for c in counts
    )
    return prompt, completion


def _entries(sizes: Callable[[], dict[str, int]], name: str) -> float:
    return float(sizes().get(name, 0))
