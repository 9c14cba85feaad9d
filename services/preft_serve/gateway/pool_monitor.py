"""Keeps the worker pool current: membership from discovery, health and residency from
the workers themselves.

Two background loops per gateway process:

* discovery (every ``discovery_interval_s``): the source's URL list becomes the pool's
  membership; a failed lookup keeps the previous list.
* health (every ``health_interval_s``): each worker's vLLM ``/health``; a worker failing
  ``unhealthy_after`` checks in a row (connection failures while proxying count too) gets
  no new requests until it passes one. A healthy worker's ``/v1/models`` tells which
  ``sha256:<hex>`` adapters it has registered, which routing prefers (affinity), and its
  ``max_model_len``, which bounds the ``max_tokens`` filled in for clients that send none
  (``context_window``).
* load (every ``load_interval_s``, only with the pool's ``worker_load`` on): each healthy
  worker's ``/metrics`` tells how many requests it runs and queues (vLLM's gauges, every
  gateway's requests), which the bounded-load cap counts. Faster than the health loop:
  with many gateways a count seconds old lets all of them fill the same worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import httpx
from prometheus_client import Gauge

from preft_serve.adapters.format import MODEL_NAME_PREFIX
from preft_serve.gateway.context_window import ContextWindow
from preft_serve.gateway.discovery import WorkerSource
from preft_serve.gateway.metrics import GatewayMetrics
from preft_serve.gateway.routing import WorkerPool

logger = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 2.0
# The checks share the completions' connection pool but carry no socket-read timeout: each
# is bounded as a whole by ``_bounded`` instead. aiohttp (3.14) re-arms a response's
# socket-read timer when a read that paused for its buffer resumes after the body ended
# (a ``/metrics`` page of hundreds of KB does); the timer then fires on the connection idle
# in the pool and fails the next request sent on it at once ("Timeout on reading data from
# socket": a completion answered 502 by a healthy worker). Without a read timeout nothing
# is armed; the completions' own (minutes) outlives the pool's idle connections.
NO_READ_TIMEOUT = httpx.Timeout(None, connect=CHECK_TIMEOUT_S)
LOAD_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def _bounded() -> asyncio.Timeout:
    """A check's whole time limit (read when the check starts: tests shorten it)."""
    return asyncio.timeout(CHECK_TIMEOUT_S)


class LoadCount:
    """Running + waiting requests in a vLLM ``/metrics`` page, summed over its series (one
    per engine), fed one line at a time: the page (hundreds of KB with many adapters) is
    read every ``load_interval_s``, and holding it whole each time grew the gateway's
    memory by fragmentation, which scanning it as it streams does not."""

    def __init__(self) -> None:
        self.total, self.seen = 0.0, False

    def feed(self, line: str) -> None:
        if line.startswith(LOAD_GAUGES):
            name, _, value = line.rpartition(" ")
            if name.split("{", 1)[0].strip() in LOAD_GAUGES:
                try:
                    self.total += float(value)
                except ValueError:
                    return
                self.seen = True

    def requests(self) -> int | None:
        """None when neither gauge was there (not a vLLM worker, or not yet)."""
        return round(self.total) if self.seen else None


class WorkerMonitor:
    def __init__(
        self,
        pool: WorkerPool,
        source: WorkerSource,
        http: httpx.AsyncClient,
        metrics: GatewayMetrics,
        *,
        discovery_interval_s: float,
        health_interval_s: float,
        load_interval_s: float | None = None,
        gauge: Gauge | None = None,
        context: ContextWindow | None = None,
    ) -> None:
        """``gauge``: where the healthy/unhealthy counts go (default the workers gauge;
        the decode pool has its own). ``context``: where the workers' context lengths go
        (both pools' monitors share one: a request's output must fit either).
        ``load_interval_s``: the load poll's period (None: at each health check)."""
        self.pool, self.source, self.http, self.metrics = pool, source, http, metrics
        self.context = context
        self.gauge = gauge if gauge is not None else metrics.workers
        self.discovery_interval_s = discovery_interval_s
        self.health_interval_s = health_interval_s
        self.load_interval_s = load_interval_s
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """One discovery and one health round now, then both loops in the background."""
        await self.refresh_membership()
        await self.check_workers()
        self._tasks = [
            asyncio.create_task(self._every(self.discovery_interval_s, self.refresh_membership)),
            asyncio.create_task(self._every(self.health_interval_s, self.check_workers)),
        ]
        if self.pool.worker_load and self.load_interval_s is not None:
            self._tasks.append(
                asyncio.create_task(self._every(self.load_interval_s, self.check_load))
            )

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @staticmethod
    async def _every(interval: float, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await step()
            except Exception:  # a loop must survive any single bad round
                logger.exception("worker monitor round failed")

    async def refresh_membership(self) -> None:
        try:
            urls = await self.source.urls()
        except Exception as exc:  # noqa: BLE001 (DNS, API server, auth: all mean "keep")
            logger.warning(
                "worker discovery (%s) failed, keeping %d workers: %s",
                self.source.describe(),
                len(self.pool.workers),
                exc,
            )
            return
        added, removed = self.pool.set_workers(urls)
        if self.context is not None:
            for url in removed:
                self.context.forget(url)
        if added or removed:
            logger.info("workers changed (%s): +%s -%s", self.source.describe(), added, removed)
        self._export()

    async def check_workers(self) -> None:
        await asyncio.gather(*(self._check(url) for url in self.pool.workers))
        self._export()

    async def _check(self, url: str) -> None:
        try:
            health = await self._get(f"{url}/health")
            healthy = health.status_code == 200
        except (httpx.HTTPError, TimeoutError):
            healthy = False
        if not healthy:
            was_up = self.pool.is_healthy(url)
            self.pool.mark_failed(url)
            if was_up and not self.pool.is_healthy(url):
                logger.warning("worker %s failed its health checks; no new requests go there", url)
            return
        self.pool.mark_ok(url)
        if self.pool.worker_load and self.load_interval_s is None:
            await asyncio.gather(self._residency(url), self._load(url))
        else:
            await self._residency(url)

    async def check_load(self) -> None:
        """Every healthy worker's running + waiting count, into the pool."""
        await asyncio.gather(
            *(self._load(url) for url in self.pool.workers if self.pool.is_healthy(url))
        )

    async def _get(self, url: str) -> httpx.Response:
        """A check's GET: bounded as a whole, no socket-read timeout (``NO_READ_TIMEOUT``)."""
        async with _bounded():
            return await self.http.get(url, timeout=NO_READ_TIMEOUT)

    async def _residency(self, url: str) -> None:
        try:
            models = (await self._get(f"{url}/v1/models")).json()
            ids = [m.get("id", "") for m in models.get("data", [])]
        except (httpx.HTTPError, TimeoutError, ValueError, AttributeError) as exc:
            logger.debug("worker %s: no adapter list (%s)", url, exc)
            return
        if self.context is not None:
            self.context.report(url, models)
        self.pool.set_resident(
            url,
            frozenset(
                i.removeprefix(MODEL_NAME_PREFIX)
                for i in ids
                if isinstance(i, str) and i.startswith(MODEL_NAME_PREFIX)
            ),
        )

    async def _load(self, url: str) -> None:
        try:
            count = LoadCount()
            async with (
                _bounded(),
                self.http.stream("GET", f"{url}/metrics", timeout=NO_READ_TIMEOUT) as page,
            ):
                page.raise_for_status()
                async for line in page.aiter_lines():
                    count.feed(line)
        except (httpx.HTTPError, TimeoutError) as exc:
            logger.debug("worker %s: no load count (%s)", url, exc)
            return
        requests = count.requests()
        if requests is not None:
            self.pool.set_worker_load(url, requests)

    def _export(self) -> None:
        healthy = sum(map(self.pool.is_healthy, self.pool.workers))
        self.gauge.labels("healthy").set(healthy)
        self.gauge.labels("unhealthy").set(len(self.pool.workers) - healthy)
