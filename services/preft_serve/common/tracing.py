"""OpenTelemetry tracing, off by default and imported only when it is on.

A service with tracing on gets a server span per request (FastAPI instrumentation) and a
client span per call made through its instrumented ``httpx`` client, which also sends the
W3C ``traceparent`` header, so a worker started with ``--otlp-traces-endpoint`` continues
the same trace. Nothing here imports ``opentelemetry`` at module level: with tracing off
(the default) a service neither needs the ``tracing`` extra nor pays for importing it.

Only traces a request started are kept: the sampler drops client spans that have no parent,
so the gateway's own background calls (worker health checks every few seconds) do not
become one-span traces. Spans go to an OTLP collector (gRPC or HTTP/protobuf) or, for local
debugging, to stdout (``console``); the exporter is chosen by name from
:data:`SPAN_PROCESSORS`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the real imports happen inside the functions, when tracing is on
    import httpx
    from fastapi import FastAPI
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

EXTRA_HINT = "install the tracing extra: pip install 'preft-serve[tracing]'"


class TracingExporter(str, enum.Enum):
    """Where spans go."""

    OTLP = "otlp"
    CONSOLE = "console"


class OtlpProtocol(str, enum.Enum):
    """The OTLP transports, spelled as ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` spells them
    (vLLM's workers read that variable too)."""

    GRPC = "grpc"
    HTTP_PROTOBUF = "http/protobuf"


@dataclass(frozen=True)
class TracingConfig:
    """One service's tracing settings (the gateway builds it from ``PREFT_GATEWAY_*``)."""

    service_name: str
    exporter: TracingExporter = TracingExporter.OTLP
    # None: the exporter's own default, i.e. OTEL_EXPORTER_OTLP_TRACES_ENDPOINT /
    # OTEL_EXPORTER_OTLP_ENDPOINT, else localhost.
    otlp_endpoint: str | None = None
    otlp_protocol: OtlpProtocol = OtlpProtocol.GRPC
    sample_ratio: float = 1.0
    # Server paths never traced (probes and scrapes would otherwise dominate the traces).
    excluded_paths: tuple[str, ...] = ()


def _otlp_processor(config: TracingConfig) -> SpanProcessor:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporter: Any
    if config.otlp_protocol is OtlpProtocol.GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        # Plain-text gRPC unless the endpoint says https (vLLM's workers do the same).
        insecure = not (config.otlp_endpoint or "").startswith("https://")
        exporter = OTLPSpanExporter(endpoint=config.otlp_endpoint, insecure=insecure)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as OTLPHttpSpanExporter,
        )

        exporter = OTLPHttpSpanExporter(endpoint=config.otlp_endpoint)
    return BatchSpanProcessor(exporter)


def _console_processor(config: TracingConfig) -> SpanProcessor:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    return SimpleSpanProcessor(ConsoleSpanExporter(service_name=config.service_name))


SPAN_PROCESSORS: dict[TracingExporter, Callable[[TracingConfig], SpanProcessor]] = {
    TracingExporter.OTLP: _otlp_processor,
    TracingExporter.CONSOLE: _console_processor,
}
"""Exporter name -> the span processor that delivers to it (tests swap in an in-memory one)."""


def _sampler(ratio: float) -> Any:
    """Follow the caller's sampling decision; start traces only at server spans (at
    ``ratio``), never at a client span without a parent (background calls)."""
    from opentelemetry.sdk.trace.sampling import (
        Decision,
        ParentBased,
        Sampler,
        SamplingResult,
        TraceIdRatioBased,
    )
    from opentelemetry.trace import SpanKind

    class RequestRoots(Sampler):
        def __init__(self) -> None:
            self.ratio = TraceIdRatioBased(ratio)

        def should_sample(
            self,
            parent_context: Any,
            trace_id: int,
            name: str,
            kind: SpanKind | None = None,
            attributes: Any = None,
            links: Sequence[Any] | None = None,
            trace_state: Any = None,
        ) -> SamplingResult:
            if kind is SpanKind.CLIENT:
                return SamplingResult(Decision.DROP)
            return self.ratio.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return f"RequestRoots{{{self.ratio.get_description()}}}"

    return ParentBased(root=RequestRoots())


def create_tracer_provider(config: TracingConfig) -> TracerProvider:
    """A tracer provider for ``config`` (not installed as the global one, so several apps
    in one process, as in tests, each keep their own). Raises with the install hint when
    the ``tracing`` extra is missing."""
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError as exc:
        raise RuntimeError(
            f"tracing is on but OpenTelemetry is not installed: {EXTRA_HINT}"
        ) from exc
    # Resource.create also reads OTEL_RESOURCE_ATTRIBUTES (pod name, namespace ...).
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: config.service_name}),
        sampler=_sampler(config.sample_ratio),
    )
    provider.add_span_processor(SPAN_PROCESSORS[config.exporter](config))
    return provider


def instrument_app(app: FastAPI, config: TracingConfig) -> TracerProvider:
    """A server span per request of ``app`` (named by route template; the W3C
    ``traceparent`` of a caller is continued). Returns the provider, for
    :func:`instrument_client`."""
    try:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    except ImportError as exc:
        raise RuntimeError(
            f"tracing is on but its FastAPI instrumentation is missing: {EXTRA_HINT}"
        ) from exc
    provider = create_tracer_provider(config)
    FastAPIInstrumentor.instrument_app(
        app,
        tracer_provider=provider,
        excluded_urls=",".join(f"{path}$" for path in config.excluded_paths) or None,
        # One span per request, not one more per ASGI message (a stream sends hundreds).
        exclude_spans=["receive", "send"],
    )
    return provider


def instrument_client(client: httpx.AsyncClient, provider: TracerProvider) -> None:
    """A client span per request ``client`` sends, with ``traceparent`` injected."""
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    HTTPXClientInstrumentor.instrument_client(client, tracer_provider=provider)
