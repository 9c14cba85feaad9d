"""Worker discovery (static, DNS, EndpointSlices) and the monitor that keeps the pool current."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from kubernetes import client as k8s
from pydantic import ValidationError

from preft_serve.gateway.discovery import DnsSource, KubernetesSource, StaticSource, worker_url
from preft_serve.gateway.metrics import GatewayMetrics
from preft_serve.gateway.pool_monitor import LoadCount, WorkerMonitor
from preft_serve.gateway.routing import WorkerPool
from preft_serve.gateway.settings import GatewaySettings


def test_dns_source_resolves_every_address() -> None:
    urls = asyncio.run(DnsSource("localhost", 8000).urls())
    assert "http://127.0.0.1:8000" in urls
    assert urls == sorted(set(urls))
    assert worker_url("http", "::1", 80) == "http://[::1]:80"


def test_settings_require_the_chosen_source() -> None:
    with pytest.raises(ValueError, match="PREFT_GATEWAY_WORKER_DNS_NAME is required"):
        GatewaySettings(discovery="dns")
    with pytest.raises(ValueError, match="PREFT_GATEWAY_WORKER_SERVICE is required"):
        GatewaySettings(discovery="kubernetes")
    ok = GatewaySettings(discovery="dns", worker_dns_name="w.ns.svc", worker_port=9000)
    assert ok.worker_urls == []


# An EndpointSlice list as the API server returns it: one ready pod, one not ready, one
# terminating, one whose readiness is unknown (counts as ready), a second slice without a
# port named http.
SLICES = {
    "apiVersion": "discovery.k8s.io/v1",
    "kind": "EndpointSliceList",
    "metadata": {},
    "items": [
        {
            "metadata": {"name": "workers-a"},
            "addressType": "IPv4",
            "ports": [{"name": "metrics", "port": 9100}, {"name": "http", "port": 8000}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": False}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": True, "terminating": True}},
                {"addresses": ["10.0.0.4"]},
            ],
        },
        {
            "metadata": {"name": "workers-b"},
            "addressType": "IPv4",
            "ports": [{"name": "api", "port": 8100}],
            "endpoints": [{"addresses": ["10.0.1.1"], "conditions": {"ready": True}}],
        },
    ],
}


@pytest.fixture
def api_server() -> Iterator[tuple[str, list[tuple[str, dict[str, list[str]]]]]]:
    """A loopback HTTP server answering the EndpointSlice list call, recording requests."""
    seen: list[tuple[str, dict[str, list[str]]]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            seen.append((url.path, parse_qs(url.query)))
            body = json.dumps(SLICES).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()


def test_kubernetes_source_lists_ready_endpoints(
    api_server: tuple[str, list[tuple[str, dict[str, list[str]]]]],
) -> None:
    url, seen = api_server
    api_client = k8s.ApiClient(k8s.Configuration(host=url))
    source = KubernetesSource("preft-worker", "serving", 8001, api_client=api_client)
    urls = asyncio.run(source.urls())
    assert urls == ["http://10.0.0.1:8000", "http://10.0.0.4:8000", "http://10.0.1.1:8001"]
    assert seen == [
        (
            "/apis/discovery.k8s.io/v1/namespaces/serving/endpointslices",
            {"labelSelector": ["kubernetes.io/service-name=preft-worker"]},
        )
    ]


class ListSource:
    """A discovery answer the test can change (or make fail)."""

    def __init__(self, urls: list[str]) -> None:
        self.current: list[str] | Exception = urls

    async def urls(self) -> list[str]:
        if isinstance(self.current, Exception):
            raise self.current
        return list(self.current)

    def describe(self) -> str:
        return "test list"


def test_monitor_tracks_membership_health_and_residency() -> None:
    down: set[str] = set()

    def worker(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host in down:
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == "/v1/models":
            return httpx.Response(
                200, json={"data": [{"id": "/models/base"}, {"id": f"sha256:{host * 4}"}]}
            )
        return httpx.Response(200)

    async def scenario() -> None:
        source = ListSource(["http://w1:8000", "http://w2:8000"])
        pool = WorkerPool(unhealthy_after=2)
        metrics = GatewayMetrics()
        async with httpx.AsyncClient(transport=httpx.MockTransport(worker)) as http:
            monitor = WorkerMonitor(
                pool, source, http, metrics, discovery_interval_s=60, health_interval_s=60
            )
            await monitor.start()
            assert pool.workers == ["http://w1:8000", "http://w2:8000"]
            assert pool.status["http://w2:8000"].resident == {"w2" * 4}
            down.add("w2")
            await monitor.check_workers()
            assert pool.is_healthy("http://w2:8000")
            await monitor.check_workers()
            assert not pool.is_healthy("http://w2:8000")
            assert metrics.workers.labels("unhealthy")._value.get() == 1
            source.current = RuntimeError("api server down")
            await monitor.refresh_membership()
            assert len(pool.workers) == 2  # a failed lookup keeps the list
            source.current = ["http://w1:8000", "http://w3:8000"]
            await monitor.refresh_membership()
            await monitor.check_workers()
            assert pool.workers == ["http://w1:8000", "http://w3:8000"]
            assert metrics.workers.labels("healthy")._value.get() == 2
            await monitor.aclose()

    asyncio.run(scenario())


# A worker's /metrics as vLLM writes it (abridged): one series per engine, a gauge whose
# name starts like the ones wanted, and the plugin's own metrics.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/models/base"} 3.0
vllm:num_requests_running{engine="1",model_name="/models/base"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="/models/base"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 9.0
preft_worker_adapter_loads_total{tier="disk",outcome="miss"} 12.0
"""


def requests_in_worker(metrics_text: str) -> int | None:
    count = LoadCount()
    for line in metrics_text.splitlines():
        count.feed(line)
    return count.requests()


def test_requests_in_worker_sums_running_and_waiting_over_engines() -> None:
    assert requests_in_worker(VLLM_METRICS) == 6
    assert requests_in_worker("preft_worker_adapter_loads_total 1.0\n") is None
    assert requests_in_worker("vllm:num_requests_running nan-ish\n") is None


def test_monitor_reads_each_workers_load_when_the_cap_counts_it() -> None:
    pages: list[str] = []

    def worker(request: httpx.Request) -> httpx.Response:
        pages.append(request.url.path)
        if request.url.path == "/metrics":
            if request.url.host == "w2":
                return httpx.Response(404)
            return httpx.Response(200, text=VLLM_METRICS)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": []})
        return httpx.Response(200)

    async def scenario(worker_load: bool) -> WorkerPool:
        pool = WorkerPool(["http://w1:8000", "http://w2:8000"], worker_load=worker_load)
        pool.acquire("http://w1:8000")
        async with httpx.AsyncClient(transport=httpx.MockTransport(worker)) as http:
            monitor = WorkerMonitor(
                pool,
                ListSource(pool.workers),
                http,
                GatewayMetrics(),
                discovery_interval_s=60,
                health_interval_s=60,
            )
            await monitor.check_workers()
        return pool

    pool = asyncio.run(scenario(worker_load=True))
    assert pool.status["http://w1:8000"].others == 5  # 6 on the worker, 1 of them ours
    assert pool.status["http://w2:8000"].others == 0  # no metrics page: own count only
    assert pool.is_healthy("http://w2:8000")
    pages.clear()
    asyncio.run(scenario(worker_load=False))
    assert "/metrics" not in pages  # off: no extra request per worker and poll


def test_a_load_loop_of_its_own_polls_only_metrics_and_more_often_than_health() -> None:
    pages: list[str] = []

    def worker(request: httpx.Request) -> httpx.Response:
        pages.append(request.url.path)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=VLLM_METRICS)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": []})
        return httpx.Response(200)

    async def scenario() -> WorkerPool:
        pool = WorkerPool(["http://w1:8000"], worker_load=True)
        async with httpx.AsyncClient(transport=httpx.MockTransport(worker)) as http:
            monitor = WorkerMonitor(
                pool,
                ListSource(pool.workers),
                http,
                GatewayMetrics(),
                discovery_interval_s=60,
                health_interval_s=60,
                load_interval_s=0.01,
            )
            await monitor.start()
            assert "/metrics" not in pages  # the health round leaves the load to its loop
            await asyncio.sleep(0.2)
            await monitor.aclose()
        return pool

    pool = asyncio.run(scenario())
    assert pages.count("/health") == 1 and pages.count("/metrics") >= 5
    assert pool.status["http://w1:8000"].others == 6


def test_static_source_is_the_configured_list() -> None:
    assert asyncio.run(StaticSource(["http://a:1"]).urls()) == ["http://a:1"]


def test_backends_are_chosen_by_name_and_an_unknown_one_lists_the_valid_ones() -> None:
    from preft_serve.gateway import discovery

    dns = GatewaySettings(discovery="dns", worker_dns_name="w.ns.svc", worker_port=9000)
    assert isinstance(discovery.create_source(dns), DnsSource)
    static = GatewaySettings(worker_urls=["http://a:1"])
    assert isinstance(discovery.create_source(static), StaticSource)
    with pytest.raises(ValueError, match="valid: static, dns, kubernetes"):
        discovery.create_source(static.model_copy(update={"discovery": "consul"}))
    with pytest.raises(ValidationError, match="'static', 'dns' or 'kubernetes'"):
        GatewaySettings(discovery="consul", worker_urls=["http://a:1"])
