"""OpenTelemetry tracing in the gateway (PREFT_GATEWAY_TRACING_ENABLED, off by default).

On: a completion is one trace with the gateway's server span and, under it, the client span
of the call to the worker, whose request carries a W3C ``traceparent`` naming that trace
(so vLLM's spans join it). Background calls (worker health checks) start no traces. Off:
nothing of OpenTelemetry is imported and no ``traceparent`` goes to the worker.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from preft_serve.common import tracing
from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, MSGS, FakeRegistry, Workers

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def settings(**overrides: object) -> GatewaySettings:
    return GatewaySettings(
        worker_urls=["http://w1:8000"], base_model_name="tiny", health_interval_s=0.05, **overrides
    )  # type: ignore[arg-type]


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """The console exporter's processor replaced by one that keeps finished spans."""
    exporter = InMemorySpanExporter()
    monkeypatch.setitem(
        tracing.SPAN_PROCESSORS,
        tracing.TracingExporter.CONSOLE,
        lambda config: SimpleSpanProcessor(exporter),
    )
    return exporter


@pytest.fixture
def workers() -> Workers:
    return Workers()


@pytest.fixture
def traced(spans: InMemorySpanExporter, workers: Workers) -> Iterator[TestClient]:
    app = create_app(
        settings(
            tracing_enabled=True, tracing_exporter="console", tracing_service_name="gw-under-test"
        ),
        transport=httpx.MockTransport(workers),
        registry=FakeRegistry(),
    )
    with TestClient(app) as client:
        yield client


def complete(client: TestClient) -> httpx.Response:
    """One chat completion through the gateway under test."""
    return client.post(
        "/v1/chat/completions",
        headers=AUTH,
        json={"model": "bot", "messages": MSGS, "max_tokens": 4},
    )


def traceparent_ids(header: str) -> tuple[str, str]:
    """(trace id, parent span id) of a W3C traceparent ``00-<trace>-<span>-<flags>``."""
    version, trace_id, span_id, flags = header.split("-")
    assert version == "00" and int(flags, 16) & 1, header  # sampled
    return trace_id, span_id


def of_kind(finished: tuple[ReadableSpan, ...], kind: SpanKind) -> list[ReadableSpan]:
    return [s for s in finished if s.kind is kind]


def test_a_completion_is_one_trace_whose_id_reaches_the_worker(
    traced: TestClient, spans: InMemorySpanExporter, workers: Workers
) -> None:
    resp = complete(traced)
    assert resp.status_code == 200, resp.text
    finished = spans.get_finished_spans()
    (server,) = of_kind(finished, SpanKind.SERVER)
    (client,) = of_kind(finished, SpanKind.CLIENT)
    assert server.name == "POST /v1/chat/completions"
    assert server.attributes is not None
    assert server.resource.attributes["service.name"] == "gw-under-test"
    assert server.context is not None and client.context is not None
    assert client.context.trace_id == server.context.trace_id
    assert client.parent is not None and client.parent.span_id == server.context.span_id
    assert client.attributes is not None
    assert (
        client.attributes.get("url.full", client.attributes.get("http.url"))
        == "http://w1:8000/v1/chat/completions"
    )
    # The worker got the trace: its parent is the gateway's client span.
    trace_id, parent_id = traceparent_ids(workers.headers[0]["traceparent"])
    assert trace_id == f"{server.context.trace_id:032x}"
    assert parent_id == f"{client.context.span_id:016x}"


def test_shutdown_sends_the_queued_spans_and_stops_the_exporter(
    monkeypatch: pytest.MonkeyPatch, workers: Workers
) -> None:
    exporter = InMemorySpanExporter()
    # A batch that would wait a minute: only the gateway's shutdown can send it.
    monkeypatch.setitem(
        tracing.SPAN_PROCESSORS,
        tracing.TracingExporter.CONSOLE,
        lambda config: BatchSpanProcessor(exporter, schedule_delay_millis=60_000),
    )
    app = create_app(
        settings(tracing_enabled=True, tracing_exporter="console"),
        transport=httpx.MockTransport(workers),
        registry=FakeRegistry(),
    )
    with TestClient(app) as client:
        resp = complete(client)
        assert resp.status_code == 200, resp.text
        assert exporter.get_finished_spans() == ()
    finished = exporter.get_finished_spans()
    assert len(of_kind(finished, SpanKind.SERVER)) == 1
    assert len(of_kind(finished, SpanKind.CLIENT)) == 1
    # The exporter was shut down with the provider: its thread retries nothing later.
    assert exporter.export(finished) is SpanExportResult.FAILURE


def test_a_callers_traceparent_is_continued(
    traced: TestClient, spans: InMemorySpanExporter, workers: Workers
) -> None:
    caller = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"
    resp = traced.post(
        "/v1/chat/completions",
        headers={**AUTH, "traceparent": caller},
        json={"model": "bot", "messages": MSGS, "max_tokens": 4, "stream": True},
    )
    assert resp.status_code == 200, resp.text
    (server,) = of_kind(spans.get_finished_spans(), SpanKind.SERVER)
    assert server.context is not None and f"{server.context.trace_id:032x}" == CALLER_TRACE
    assert traceparent_ids(workers.headers[0]["traceparent"])[0] == CALLER_TRACE


def test_probes_and_health_checks_start_no_traces(
    traced: TestClient, spans: InMemorySpanExporter, workers: Workers
) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        assert traced.get(path).status_code == 200, path
    time.sleep(0.3)  # the monitor polls the worker every 50 ms: several rounds of that
    assert spans.get_finished_spans() == ()


def test_off_by_default_sends_no_traceparent(workers: Workers) -> None:
    assert GatewaySettings(worker_urls=["http://w1:8000"]).tracing_enabled is False
    app = create_app(settings(), transport=httpx.MockTransport(workers), registry=FakeRegistry())
    with TestClient(app) as client:
        resp = complete(client)
    assert resp.status_code == 200, resp.text
    assert "traceparent" not in workers.headers[0]


def test_off_imports_no_opentelemetry() -> None:
    """A gateway that served a completion with tracing off imported nothing of OpenTelemetry
    (a fresh interpreter: this test process has it loaded already). redis-py 8 itself
    imports the OTel metrics API when it is installed (as in this venv, not in the gateway
    image): those modules are the baseline, and no tracing, instrumentation, exporter or
    propagation module may come on top."""
    script = textwrap.dedent("""
        import sys
        import redis.asyncio

        def otel():
            return {m for m in sys.modules if m.split(".")[0] == "opentelemetry"}

        baseline = otel()
        import httpx
        from fastapi.testclient import TestClient
        from preft_serve.gateway.app import create_app
        from preft_serve.gateway.settings import GatewaySettings
        from tests.support.gateway import AUTH, MSGS, FakeRegistry, Workers

        app = create_app(GatewaySettings(worker_urls=["http://w1:8000"]),
                         transport=httpx.MockTransport(Workers()), registry=FakeRegistry())
        with TestClient(app) as client:
            resp = client.post("/v1/chat/completions", headers=AUTH,
                               json={"model": "bot", "messages": MSGS, "max_tokens": 4})
        assert resp.status_code == 200, resp.text
        print(sorted(otel() - baseline))
        print(sorted(m for m in otel() if m.startswith(FORBIDDEN)))
    """).replace(
        "FORBIDDEN",
        repr(
            (
                "opentelemetry.sdk.trace",
                "opentelemetry.instrumentation",
                "opentelemetry.exporter",
                "opentelemetry.propagate",
            )
        ),
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "[]"]


def test_a_missing_extra_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(RuntimeError, match=r"pip install 'preft-serve\[tracing\]'"):
        tracing.create_tracer_provider(tracing.TracingConfig(service_name="x"))


def test_settings_name_the_exporter_and_protocol() -> None:
    config = settings(
        tracing_enabled=True,
        otlp_endpoint="http://collector:4318/v1/traces",
        otlp_protocol="http/protobuf",
        tracing_sample_ratio=0.25,
    ).tracing
    assert config == tracing.TracingConfig(
        service_name="preft-gateway",
        exporter=tracing.TracingExporter.OTLP,
        otlp_endpoint="http://collector:4318/v1/traces",
        otlp_protocol=tracing.OtlpProtocol.HTTP_PROTOBUF,
        sample_ratio=0.25,
        excluded_paths=("/healthz", "/readyz", "/metrics"),
    )
    # Both OTLP transports build (nothing is sent until a span ends).
    for protocol in tracing.OtlpProtocol:
        provider = tracing.create_tracer_provider(
            tracing.TracingConfig(
                service_name="x", otlp_endpoint="http://127.0.0.1:9", otlp_protocol=protocol
            )
        )
        provider.shutdown()
    with pytest.raises(ValueError, match="tracing_sample_ratio"):
        settings(tracing_sample_ratio=2)
    with pytest.raises(ValueError, match="otlp_protocol"):
        settings(otlp_protocol="thrift")
