"""The worker monitor's checks leave no timer on the connections completions reuse, and
are still bounded in time.

The checks and the completions share one aiohttp connection pool. aiohttp (3.14) re-arms a
response's socket-read timer when a read that paused for its buffer resumes after the body
ended; the timer then fires on the connection idle in the pool and fails the next request
sent on it at once ("Timeout on reading data from socket": a completion answered 502 by a
healthy worker, seen in the soak after a ``/metrics`` poll). So the checks send no
socket-read timeout, and each is bounded as a whole instead.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from preft_serve.gateway import pool_monitor
from preft_serve.gateway.discovery import StaticSource
from preft_serve.gateway.metrics import GatewayMetrics
from preft_serve.gateway.pool_monitor import WorkerMonitor
from preft_serve.gateway.routing import WorkerPool

WORKER = "http://worker-0:8000"
METRICS_PAGE = (
    'vllm:num_requests_running{engine="0"} 3.0\nvllm:num_requests_waiting{engine="0"} 1.0\n'
)


def _monitor(url: str, transport: httpx.AsyncBaseTransport) -> tuple[WorkerMonitor, WorkerPool]:
    pool = WorkerPool([url], worker_load=True)
    monitor = WorkerMonitor(
        pool,
        StaticSource([url]),
        httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(300.0, connect=2.0)),
        GatewayMetrics(),
        discovery_interval_s=60,
        health_interval_s=60,
    )
    return monitor, pool


def test_health_models_and_load_checks_send_no_socket_read_timeout() -> None:
    seen: dict[str, dict[str, Any]] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        seen[request.url.path] = request.extensions["timeout"]
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "sha256:" + "a" * 64}]})
        if request.url.path == "/metrics":
            return httpx.Response(200, text=METRICS_PAGE)
        return httpx.Response(200)

    monitor, pool = _monitor(WORKER, httpx.MockTransport(answer))
    asyncio.run(monitor.check_workers())  # without a load interval the load is read here too
    assert set(seen) == {"/health", "/v1/models", "/metrics"}
    for path, timeout in seen.items():
        assert timeout["read"] is None, path
        assert timeout["connect"] == pool_monitor.CHECK_TIMEOUT_S, path
    # The checks did their work: healthy, the adapter resident, the load read.
    assert pool.is_healthy(WORKER)
    assert pool.status[WORKER].resident == frozenset({"a" * 64})
    assert pool.status[WORKER].others == 4


async def _silent_worker() -> tuple[asyncio.Server, str]:
    """Accepts connections and reads requests, never answers."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65_536)
        await asyncio.sleep(60)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def test_a_worker_that_never_answers_fails_its_check_within_the_check_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_monitor, "CHECK_TIMEOUT_S", 0.3)

    async def run() -> tuple[float, WorkerPool]:
        server, url = await _silent_worker()
        monitor, pool = _monitor(url, httpx.AsyncHTTPTransport())
        try:
            start = time.perf_counter()
            await monitor.check_workers()
            await monitor.check_load()
            return time.perf_counter() - start, pool
        finally:
            server.close()
            await monitor.http.aclose()

    elapsed, pool = asyncio.run(run())
    status = next(iter(pool.status.values()))
    assert status.failures == 1  # the health check failed, counted once
    assert status.others == 0  # no load was read
    assert 0.3 <= elapsed < 3.0  # both bounded by the check timeout, not the client's 300 s
