"""The discrete-event loop: requests through gateways to workers, and the cluster's
membership, health and residency as each gateway sees them.

Time only moves between events (a heap); nothing sleeps. Per request: the product's
``select_target`` through the gateway's :class:`ResolveCache`, one routing decision by the
product's ``take_route`` (the gateway's own :class:`WorkerPool` choice, its open-request
limit, the tenant's cold-load slot), then ``acquire`` / ``mark_ok`` / ``release`` around the
request, as ``gateway/proxy.py`` does), the worker's
tiers and step model. A client keeps its keep-alive connection to one gateway, so each user
is pinned to one (a fixed hash of the user). Background events: each gateway's health and
residency poll, load poll and discovery refresh (each with its own phase), usage flushes,
load samples, and the scenario's actions.

Pod lifecycle (Kubernetes Deployment): a pod added becomes an endpoint once ready; a pod
terminated leaves the endpoints at once, refuses new connections and finishes what it runs;
a lost node keeps its endpoint for ``node_lost_endpoint_s`` (the node controller's grace
period) while connections to it time out after ``connect_timeout_s``.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bench.scale_sim.gateway import USAGE_FLUSH_S, SimGateway, product_settings
from bench.scale_sim.model import Pauses, Profile, WorkerConfig
from bench.scale_sim.worker import Req, SimWorker
from bench.scale_sim.workload import Population, Requests
from preft_serve.common.errors import ServiceUnavailable, TooManyRequests
from preft_serve.gateway.proxy import take_route
from preft_serve.gateway.routing import WorkerPool
from preft_serve.gateway.settings import GatewaySettings

ARRIVE, POLL, DISCOVER, FLUSH, ACTION, SAMPLE, HANDOFF, STEP, LOAD = range(9)
REFUSED_S = 0.001  # a terminated pod's address refuses at once
SAMPLE_S = 0.5
MAX_TRIES = 3  # routing attempts of one request (choose, then its order)
DRAIN_S = 300.0  # after the last arrival, how long running requests may still take
# The OpenAI Python client's retries of a 429 or 503 (openai._constants): 2 more tries,
# 0.5 s x 2^n (at most 8 s) apart, less up to a quarter of jitter.
CLIENT_RETRIES, RETRY_DELAY_S, RETRY_DELAY_MAX_S = 2, 0.5, 8.0


@dataclass
class Options:
    """What shapes one cluster run."""

    profile: Profile
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    gateway: GatewaySettings = field(default_factory=product_settings)
    workers: int = 100
    gateways: int = 10
    decode_workers: int = 0  # > 0: a decode pool (prefill pool = ``workers``)
    node_lost_endpoint_s: float = 40.0
    pre_stop_s: float = 15.0  # worker.preStopSleepSeconds
    pauses: Pauses | None = None  # the k-th worker started replays workers[k] (validate.py)
    seed: int = 0


class Cluster:
    def __init__(self, pop: Population, options: Options) -> None:
        self.pop, self.opt = pop, options
        self.profile = options.profile
        self.rng = np.random.default_rng([options.seed, 2])
        self.t = 0.0
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.workers: dict[str, SimWorker] = {}
        self.gone: dict[str, SimWorker] = {}  # terminated, still finishing
        self.retired: list[SimWorker] = []  # no longer running (their counters still count)
        self.endpoints: list[str] = []
        self.decode_endpoints: list[str] = []
        self.generation: Counter[str] = Counter()
        self.spawned = 0
        role = "prefill" if options.decode_workers else "unified"
        for k in range(options.workers):
            self.add_worker(f"w{k}", role, ready=True)
        for k in range(options.decode_workers):
            self.add_worker(f"d{k}", "decode", ready=True)
        self.gateways = [
            SimGateway(
                g, options.gateway, list(self.endpoints), pop, list(self.decode_endpoints) or None
            )
            for g in range(options.gateways)
        ]
        self.finished: list[Req] = []
        self.on_finish: Callable[[Req], None] | None = None
        self.redis: Counter[tuple[str, str]] = Counter()  # (component, command), not gateway
        self.load_sum: Counter[str] = Counter()
        self.load_n: Counter[str] = Counter()
        self.next_id = 0
        self.open = 0  # requests submitted and not yet done or failed
        gcfg = options.gateway
        for g in range(options.gateways):
            self.push(self.rng.uniform(0, gcfg.health_interval_s), POLL, g)
            self.push(self.rng.uniform(0, gcfg.discovery_interval_s), DISCOVER, g)
            self.push(self.rng.uniform(0, USAGE_FLUSH_S), FLUSH, g)
            if gcfg.cap_on_worker_load:
                self.push(self.rng.uniform(0, gcfg.load_poll_interval_s), LOAD, g)
        self.push(SAMPLE_S, SAMPLE, None)

    # -- membership ----------------------------------------------------------------------

    def add_worker(
        self, name: str, role: str, ready: bool = False, start_s: float | None = None
    ) -> str:
        """A new pod (a new address: Deployments give every pod its own); an endpoint now
        (``ready``) or after ``start_s`` (default the profile's ``pod_start_s``)."""
        url = f"http://{name}.{self.generation[name]}:8000"
        self.generation[name] += 1
        self.spawned += 1  # each pod its own random stream
        pauses = self.opt.pauses.workers if self.opt.pauses else ((),)
        self.workers[url] = SimWorker(
            url,
            self.profile,
            self.opt.worker,
            np.random.default_rng([self.opt.seed, 3, self.spawned]),
            self.t,
            role,
            pauses[(self.spawned - 1) % len(pauses)],
        )
        if ready:
            self._endpoint(url)
        else:
            delay = self.profile.pod_start_s if start_s is None else start_s
            self.at(self.t + delay, lambda: self._endpoint(url))
        return url

    def _endpoint(self, url: str) -> None:
        worker = self.workers.get(url)
        if worker is not None and worker.alive:
            (self.decode_endpoints if worker.role == "decode" else self.endpoints).append(url)

    def _unlist(self, url: str) -> None:
        for listed in (self.endpoints, self.decode_endpoints):
            if url in listed:
                listed.remove(url)

    def terminate(self, url: str) -> None:
        """Graceful (the chart's preStop sleep): out of the endpoints at once, still serving
        for ``pre_stop_s`` while gateways notice, then refuses connections and finishes
        what it runs."""
        self._unlist(url)
        self.at(self.t + self.opt.pre_stop_s, lambda: self._stop(url))

    def _stop(self, url: str) -> None:
        worker = self.workers.pop(url)
        worker.accepting = False
        if worker.running or worker.waiting:
            self.gone[url] = worker
        else:
            self.retired.append(worker)

    def lose(self, url: str) -> None:
        """The node is gone: its requests fail, its endpoint stays a while."""
        worker = self.workers[url]
        for req in worker.kill():
            pool = self._pool(req)
            if pool is not None:
                pool.release(url)
            self.fail(req, "worker_lost")
        self.at(self.t + self.opt.node_lost_endpoint_s, lambda: self._drop(url))

    def _drop(self, url: str) -> None:
        self._unlist(url)
        worker = self.workers.pop(url, None)
        if worker is not None:
            self.retired.append(worker)

    # -- events --------------------------------------------------------------------------

    def push(self, t: float, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, payload))

    def at(self, t: float, action: Callable[[], None]) -> None:
        self.push(t, ACTION, action)

    def run(self, requests: Requests, until: float) -> None:
        """Serve ``requests`` (arrivals before ``until``), then let running ones finish
        (for at most ``DRAIN_S``)."""
        times, users = requests.t, requests.user
        prompts, outputs, streams = requests.prompt, requests.output, requests.stream
        n = int(np.searchsorted(times, until))
        i = 0
        heap = self.heap
        while True:
            ta = times[i] if i < n else math.inf
            th = heap[0][0] if heap else math.inf
            if ta == math.inf and ((self.open == 0 and th >= until) or th > until + DRAIN_S):
                break
            if ta <= th:
                self.t = float(ta)
                self.submit(int(users[i]), int(prompts[i]), int(outputs[i]), bool(streams[i]))
                i += 1
                continue
            t, _, kind, payload = heapq.heappop(heap)
            self.t = t
            self.dispatch(kind, payload)

    def dispatch(self, kind: int, payload: object) -> None:
        if kind == ARRIVE:
            req, url = payload  # type: ignore[misc]
            self._arrive_worker(req, url)
        elif kind == STEP:
            worker, gen = payload  # type: ignore[misc]
            if worker.gen == gen:  # else superseded by a later wake-up
                left, wake = worker.step_done(self.t)
                if wake is not None:
                    self.push(wake, STEP, (worker, worker.gen))
                for req in left:
                    self.done(req)
        elif kind == HANDOFF:
            self.decode_hop(payload)  # type: ignore[arg-type]
        elif kind == POLL:
            self.poll(payload)  # type: ignore[arg-type]
            self.push(self.t + self.opt.gateway.health_interval_s, POLL, payload)
        elif kind == DISCOVER:
            gw = self.gateways[payload]  # type: ignore[index]
            gw.pool.set_workers(self.endpoints)
            if gw.decode_pool is not None:
                gw.decode_pool.set_workers(self.decode_endpoints)
            self.push(self.t + self.opt.gateway.discovery_interval_s, DISCOVER, payload)
        elif kind == FLUSH:
            self.gateways[payload].flush_usage()  # type: ignore[index]
            self.push(self.t + USAGE_FLUSH_S, FLUSH, payload)
        elif kind == LOAD:
            self.poll_load(payload)  # type: ignore[arg-type]
            self.push(self.t + self.opt.gateway.load_poll_interval_s, LOAD, payload)
        elif kind == ACTION:
            payload()  # type: ignore[operator]
        elif kind == SAMPLE:
            for url in (*self.endpoints, *self.decode_endpoints):
                w = self.workers[url]
                if w.alive:
                    self.load_sum[url] += len(w.running) + len(w.waiting)
                    self.load_n[url] += 1
            self.push(self.t + SAMPLE_S, SAMPLE, None)

    def poll(self, g: int) -> None:
        """``WorkerMonitor.check_workers``: health, then the adapters ``/v1/models`` lists."""
        gw = self.gateways[g]
        for pool, residency in ((gw.pool, True), (gw.decode_pool, False)):
            if pool is None:
                continue
            for url in pool.workers:
                worker = self.workers.get(url)
                if worker is None or not worker.accepting:
                    pool.mark_failed(url)
                    continue
                pool.mark_ok(url)
                if residency:
                    pool.set_resident(url, worker.reported.snapshot())

    def poll_load(self, g: int) -> None:
        """``WorkerMonitor.check_load``: each healthy worker's running + waiting count."""
        gw = self.gateways[g]
        for pool in (gw.pool, gw.decode_pool):
            if pool is None:
                continue
            for url in pool.workers:
                worker = self.workers.get(url)
                if worker is not None and worker.accepting and pool.is_healthy(url):
                    pool.set_worker_load(url, self.engine_requests(worker))

    def engine_requests(self, worker: SimWorker) -> int:
        """What vLLM's ``num_requests_running`` + ``num_requests_waiting`` count: not a
        request whose adapter is still being fetched (the resolver holds it in the API
        server, before the engine); one whose adapter is being parsed waits in the engine."""
        t = self.t
        fetching = sum(1 for r in worker.waiting if r.fetched > t) if worker.waiting else 0
        return len(worker.running) + len(worker.waiting) - fetching

    # -- requests ------------------------------------------------------------------------

    def gateway_of(self, user: int) -> int:
        """The gateway a user's client is connected to: a Service spreads connections, and
        a client keeps its keep-alive connection (a fixed multiplicative hash of the user)."""
        return ((user * 0x9E3779B1) & 0xFFFFFFFF) * len(self.gateways) >> 32

    def submit(self, user: int, prompt: int, output: int, stream: bool) -> Req:
        """A request arrives at its user's gateway."""
        pop = self.pop
        g = self.gateway_of(user)
        gw = self.gateways[g]
        target = gw.target(user)
        hit = gw.hit
        ref = target.adapter
        assert ref is not None  # every simulated user has a binding
        adapter = int(ref.name[1:])
        req = Req(
            self.next_id,
            self.t,
            user,
            adapter,
            int(pop.adapter_tenant[adapter]),
            ref.sha256,
            prompt,
            output,
            stream,
            ref.mode.value == "all",
            gateway=g,
            key=target.routing_key,
        )
        self.next_id += 1
        self.open += 1
        delay = self.profile.gateway_cpu_s + (0.0 if hit else self.profile.redis_rtt_s)
        req.two_pools = gw.decode_pool is not None and not req.all_token
        self.route(req, gw, delay)
        return req

    def _pool(self, req: Req) -> WorkerPool | None:
        gw = self.gateways[req.gateway]
        return gw.decode_pool if req.decode_worker else gw.pool

    def route(self, req: Req, gw: SimGateway, delay: float, tries: int = 0) -> None:
        """``open_upstream``: the product's routing decision (``take_route``: a 503 at the
        pool's open-request limit, a 429 past the tenant's cold loads), then its order past
        unreachable workers."""
        pool = gw.pool
        try:  # a retry keeps the cold-load slot it holds
            route = take_route(
                pool, req.key, None if req.cold_tenant else f"t{req.tenant}", req.two_pools
            )
        except ServiceUnavailable:
            self.refused(req, gw, "gateway_busy")
            return
        except TooManyRequests:
            self.refused(req, gw, "too_many_cold_loads")
            return
        choice = route.choice
        if route.cold_tenant is not None:
            req.cold_tenant = route.cold_tenant
        for url in choice.order:
            worker = self.workers.get(url)
            if worker is None or not worker.accepting:
                pool.mark_failed(url)
                lost = worker is not None and not worker.alive
                delay += self.opt.gateway.connect_timeout_s if lost else REFUSED_S
                continue
            pool.acquire(url)
            pool.mark_ok(url)  # the worker answered (open_upstream, once headers arrive)
            req.route = choice.landed(url).value
            req.worker = url
            if delay > 0.05:
                self.push(self.t + delay, ARRIVE, (req, url))
            else:
                self._start(req, worker, self.t + delay)
            return
        self.fail(req, "no_worker")

    def refused(self, req: Req, gw: SimGateway, why: str) -> None:
        """A 429 or 503 from the gateway: the client sends the request again (to the same
        gateway, its keep-alive connection) after its backoff, or gives up."""
        if req.retries >= CLIENT_RETRIES:
            self.fail(req, why)
            return
        backoff = min(RETRY_DELAY_S * 2**req.retries, RETRY_DELAY_MAX_S)
        req.retries += 1
        wait = backoff * (1 - 0.25 * self.rng.random()) + self.profile.gateway_cpu_s
        self.at(self.t + wait, lambda: self.route(req, gw, 0.0))

    def _arrive_worker(self, req: Req, url: str) -> None:
        worker = self.workers.get(url)
        if worker is None or not worker.accepting:
            gw = self.gateways[req.gateway]
            gw.pool.release(url)
            gw.pool.mark_failed(url)
            if req.state == "new":
                self.route(req, gw, self.opt.gateway.connect_timeout_s)
            return
        self._start(req, worker, self.t)

    def _start(self, req: Req, worker: SimWorker, t: float) -> None:
        wake = worker.arrive(req, t)
        if wake is not None:
            self.push(wake, STEP, (worker, worker.gen))
        if req.cold_tenant and req.stream:  # the stream's headers: once its adapter is in
            self.at(max(req.ready, self.t), lambda: self._release_cold(req))

    def done(self, req: Req) -> None:
        if req.state in ("done", "failed"):
            return
        decoding = bool(req.decode_worker)
        url = req.decode_worker if decoding else req.worker
        worker = self.workers.get(url) or self.gone.get(url)
        gw = self.gateways[req.gateway]
        pool = gw.decode_pool if decoding else gw.pool
        # the request has left its worker's batch (SimWorker.step_done): a terminated
        # worker with nothing left retires
        if (
            worker is not None
            and not worker.accepting
            and worker.alive
            and not worker.running
            and not worker.waiting
            and url in self.gone
        ):
            self.retired.append(self.gone.pop(url))
        assert pool is not None
        pool.release(url)
        self._release_cold(req)
        if req.two_pools and not decoding:
            transfer = req.prompt * self.profile.kv_bytes_per_token / self.profile.kv_link_bytes_s
            self.push(self.t + self.profile.handoff_s + transfer, HANDOFF, req)
            return
        req.done = self.t
        req.state = "done"
        self.open -= 1
        gw.usage.add((req.tenant, req.adapter))
        self.finished.append(req)
        if self.on_finish is not None:
            self.on_finish(req)

    def decode_hop(self, req: Req) -> None:
        """``Handoff.open_decode``: the decode pool by load alone (a per-request key)."""
        gw = self.gateways[req.gateway]
        pool = gw.decode_pool
        assert pool is not None
        choice = pool.choose(f"r{req.id}")
        for url in choice.order:
            worker = self.workers.get(url)
            if worker is None or not worker.accepting:
                pool.mark_failed(url)
                continue
            pool.acquire(url)
            pool.mark_ok(url)
            req.decode_worker = url
            self._start(req, worker, self.t)
            return
        self.fail(req, "no_decode_worker")

    def _release_cold(self, req: Req) -> None:
        """The request's cold-load slot, once its worker answers (``open_upstream``): a
        stream's headers once its adapter is loaded, a whole answer's at its end."""
        if req.cold_tenant:
            self.gateways[req.gateway].pool.cold.release(req.cold_tenant)
            req.cold_tenant = ""

    def fail(self, req: Req, why: str) -> None:
        if req.state in ("done", "failed"):
            return
        self._release_cold(req)
        req.state, req.error, req.done = "failed", why, self.t
        self.open -= 1
        self.finished.append(req)
        if self.on_finish is not None:
            self.on_finish(req)
