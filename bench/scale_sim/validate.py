"""The simulator against a real run: the 2,000-adapter load test (``bench/loadtest.py``),
simulated with the configuration its summary records, side by side with what it measured.

The load test runs one worker, one gateway, Redis and the registry on the same 2 cores as
locust's 50 closed-loop users (each sends its next request when the last one ends, for a
uniformly random user, or one drawn with Zipf popularity where the run's setup records
``zipf`` > 0; user i is bound to adapter i). How fast that machine runs is a
property of its phase, not of the product (the same command measured 46.7 to 99.5 req/s), so
**one number is fitted per run**: ``phase``, the factor on every CPU cost of the ``cpu``
profile that makes the simulated throughput equal the measured one. Everything compared is
then a prediction: the routing counts (resident / preferred / spill), the share of requests
that fetched their adapter from the store, and TTFT p50 (streamed requests, as locust
measures it). Where a run recorded its workers' step traces and fetch times
(``<out>_steps.json``), each simulated worker replays one real worker's pauses and fetches
in the measured time, which the phase then leaves alone (``stalls.py``): two workers on the
2 cores pause in turn, and that is where their spills come from. Where a run measured the
time its requests spent outside the engines (``outside.py``: locust and the gateway's HTTP
server before the gateway routes a request, the gateway and the API server while it holds
its worker's in-flight slot), each simulated request spends that time there too: it
delays the first token and, inside the slot, counts against the bounded-load cap. The
phase then fits only the engines' costs.

Agreement required: shares within 5 points, TTFT p50 within 25%.
"""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from bench.results import RECORDED, ROOT
from bench.scale_sim import metrics, outside, stalls
from bench.scale_sim.cluster import Cluster, Options
from bench.scale_sim.gateway import SimGateway, product_settings
from bench.scale_sim.model import CPU, GIB, Pauses, Profile, WorkerConfig
from bench.scale_sim.outside import Outside
from bench.scale_sim.worker import Req
from bench.scale_sim.workload import Population, Requests
from preft_serve.gateway.settings import GatewaySettings

RECORDED = (
    RECORDED / "locust_summary.json",
    RECORDED / "loadtest_stalls" / "run1_summary.json",
    RECORDED / "loadtest_stalls" / "run2_summary.json",
    RECORDED / "locust_timed_summary.json",  # one worker, time outside measured
    RECORDED / "locust_2w_summary.json",  # two workers, untraced
    RECORDED / "locust_2w_traced_summary.json",  # both traced, outside time unmeasured
    RECORDED / "locust_2w_timed_b_summary.json",  # traced, time outside measured
    RECORDED / "locust_2w_cap_off_summary.json",  # the same command a third time
    RECORDED / "locust_2w_timed_summary.json",
)  # the same, the two-worker reference
# Must agree: the one-worker and two-worker references, both with the time outside the
# engines measured (without it the fitted phase puts that time in the adapter queue).
REQUIRED = (RECORDED[3], RECORDED[-1])
SPAWN_RATE = 10.0  # loadtest.py --spawn-rate default (the summary does not record it)
TEMPLATE_TOKENS = 22  # the toy tokenizer's chat template around one user message, bytes
WORD_TOKENS = 5.7  # mean bytes of a locustfile word and its space (byte-level tokenizer)
SERVE_DEFAULTS = WorkerConfig(
    max_loras=8, max_cpu_loras=64, disk_bytes=10 * GIB, prefetch_on_update=False
)
SHARE_POINTS = 0.05
TTFT_RATIO = 0.25


def recorded(path: Path) -> dict[str, Any]:
    """What a load-test summary measured, in the simulator's terms."""
    data = json.loads(path.read_text())
    s = data["summary"]
    routes = {
        k.split("result=")[1].rstrip("}"): v
        for k, v in data["gateway_metrics"].items()
        if "routing_total" in k
    }
    routed = sum(routes.values())
    misses = sum(
        v for k, v in data["worker_metrics"].items() if "tier=disk" in k and "outcome=miss" in k
    )
    name = (
        str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)
    )
    return {
        "file": name,
        "setup": data["setup"],
        "requests": s["requests"],
        "throughput_rps": s["throughput_rps"],
        "ttft_p50_ms": s["ttft_ms"]["p50"],
        "ttft_p99_ms": s["ttft_ms"]["p99"],
        "routing_share": {
            r: round(routes.get(r, 0) / routed, 4)
            for r in ("resident", "preferred", "replica", "spill")
        },
        "store_share": round(misses / s["requests"], 4),
        "distinct_users": s["distinct_users"],
        **timing(data),
    }


def timing(data: dict[str, Any]) -> dict[str, Any]:
    """Where the run's requests spent their time (``outside.breakdown``) and how many the
    engines held on average (vLLM's end-to-end time over the run), where measured."""
    section = data.get("timing") or {}
    if "breakdown_ms" not in section:
        return {}
    e2e = section["histograms"].get("vllm:e2e_request_latency_seconds", {})
    gateway = section["histograms"].get("preft_gateway_request_seconds", {})
    span = data["summary"]["duration_s"]
    return {
        "breakdown_ms": section["breakdown_ms"],
        "engine_requests_mean": round(e2e.get("sum_s", 0.0) / span, 1),
        "gateway_requests_mean": round(gateway.get("sum_s", 0.0) / span, 1),
    }


def worker_config(setup: dict[str, Any]) -> WorkerConfig:
    """``serve.py``'s defaults, with ``--max-loras``, ``--max-cpu-loras``, ``--max-num-seqs``
    and ``--max-num-batched-tokens`` from the run's ``worker_args`` where it set them (the
    load test passes ``--max-num-seqs 64``)."""
    args = str(setup.get("worker_args", "")).replace("=", " ").split()
    flags = {a: int(b) for a, b in pairwise(args) if a.startswith("--") and b.isdigit()}
    return replace(
        SERVE_DEFAULTS,
        max_loras=flags.get("--max-loras", 8),
        max_cpu_loras=flags.get("--max-cpu-loras", 64),
        max_num_seqs=flags.get("--max-num-seqs"),
        max_num_batched_tokens=flags.get("--max-num-batched-tokens"),
    )


def recorded_settings(setup: dict[str, Any]) -> GatewaySettings:
    """The gateway settings a recorded run had: its ``gateway_env`` and
    ``cap_on_worker_load`` where it says, else what it ran before they existed (the cap on
    the gateway's own counts, its load read with the health checks; hot replicas sized by
    the cap's headroom; no cold-load budget)."""
    env = setup.get("gateway_env") or {}
    base = product_settings()
    changes: dict[str, Any] = {
        "cap_on_worker_load": bool(setup.get("cap_on_worker_load", False)),
        "load_poll_interval_s": base.health_interval_s,
        "hot_headroom": base.load_factor - 1.0,
        "tenant_cold_loads": 0,
    }
    for name, field, kind in (
        ("PREFT_GATEWAY_HOT_REPLICAS", "hot_replicas", int),
        ("PREFT_GATEWAY_HOT_HEADROOM", "hot_headroom", float),
        ("PREFT_GATEWAY_LOAD_POLL_INTERVAL_S", "load_poll_interval_s", float),
        ("PREFT_GATEWAY_TENANT_COLD_LOADS", "tenant_cold_loads", int),
    ):
        if name in env:
            changes[field] = kind(env[name])
    return product_settings(**changes)


class LoadTestCluster(Cluster):
    """The load test's cluster, with its requests' time outside the engines: a routed
    request holds its in-flight slot ``outside.slot`` seconds before its worker sees it."""

    def __init__(self, pop: Population, options: Options, spent: Outside | None) -> None:
        super().__init__(pop, options)
        self.outside = spent
        self.outside_rng = np.random.default_rng([options.seed, 9])
        self.routed: dict[int, float] = {}  # request id -> when the gateway first routed it

    def route(self, req: Req, gw: SimGateway, delay: float, tries: int = 0) -> None:
        if not req.worker:  # the first routing, not a retry
            self.routed[req.id] = self.t
            if self.outside is not None:
                delay += self.outside.slot(self.outside_rng)
        super().route(req, gw, delay, tries)


def simulate(
    setup: dict[str, Any],
    profile: Profile,
    seed: int,
    pauses: Pauses | None = None,
    spent: Outside | None = None,
) -> dict[str, Any]:
    """One load-test run in the simulator: closed-loop users for the recorded duration, on
    ``setup["workers"]`` workers (1 when the summary does not say) behind one gateway
    (``PREFT_GATEWAY_HOT_REPLICAS`` from the setup's ``gateway_env`` where it sets it), users
    drawn uniformly or with the setup's ``zipf`` popularity (the simulator's own seeded
    ranks: which adapters are hot, and so their workers, differ from the run's),
    each pausing as ``pauses`` says (the run's measured pauses, ``stalls.py``), each request
    spending ``spent`` outside the engines (``outside.py``)."""
    adapters, users = int(setup["adapters"]), int(setup["users"])
    duration = float(str(setup["duration"]).rstrip("s"))
    low, high = setup["max_tokens"]
    wlow, whigh = setup["prompt_words"]
    zipf = float(setup.get("zipf", 0.0))
    pop = Population(
        adapters,
        adapters,
        int(setup["tenants"]),
        zipf,
        seed,
        all_fraction=0.0,
        tenant_exponent=0.0,
        one_to_one=True,
    )
    cum = np.cumsum(pop.user_weight)
    cluster = LoadTestCluster(
        pop,
        Options(
            profile,
            worker_config(setup),
            recorded_settings(setup),
            workers=int(setup.get("workers", 1)),
            gateways=1,
            pauses=pauses,
            seed=seed,
        ),
        spent,
    )
    # The recorded gateways predate the resident slack (a warm worker one past the cap
    # before a cold spill): route as they did unless the summary records the slack.
    for gw in cluster.gateways:
        gw.pool.resident_slack = int(setup.get("resident_slack", 0))
    rng = np.random.default_rng([seed, 8])

    def send() -> None:
        words = int(rng.integers(wlow, whigh + 1))
        user = (
            int(rng.integers(adapters))
            if zipf <= 0  # uniform: draws as before
            else min(int(np.searchsorted(cum, rng.random(), side="right")), adapters - 1)
        )
        args = (
            user,
            int(TEMPLATE_TOKENS + WORD_TOKENS * words),
            int(rng.integers(low, high + 1)),
            bool(rng.random() < setup["stream_fraction"]),
        )
        if spent is None:
            cluster.submit(*args)
            return
        sent = cluster.t

        def arrive() -> None:  # at the gateway: the request's clock started at the client
            cluster.submit(*args).t0 = sent

        cluster.at(sent + spent.client(cluster.outside_rng), arrive)

    def again(req: Req) -> None:
        if cluster.t < duration:
            cluster.at(cluster.t, send)

    cluster.on_finish = again
    for k in range(users):
        cluster.at(k / SPAWN_RATE, send)
    before = metrics.snapshot(cluster)
    empty = np.zeros(0)
    cluster.run(
        Requests(
            empty,
            empty.astype(np.int64),
            empty.astype(np.int64),
            empty.astype(np.int64),
            empty.astype(bool),
        ),
        duration,
    )
    after = metrics.snapshot(cluster)
    window = metrics.summarize(cluster, 0.0, duration, before, after)
    done = [r for r in cluster.finished if r.state == "done"]
    span = max(r.done for r in done) - min(r.t0 for r in done)
    lat = metrics.latency(cluster.finished, stream_only=True)
    engine_load = sum(cluster.load_sum[u] / cluster.load_n[u] for u in cluster.load_n)
    gateway_load = sum(r.done - cluster.routed[r.id] for r in done) / span
    return {
        "requests": len(cluster.finished),
        "throughput_rps": round(len(done) / span, 2),
        "ttft_p50_ms": lat["ttft_p50_ms"],
        "ttft_p99_ms": lat["ttft_p99_ms"],
        "routing_share": window["routing_share"],
        "store_share": round(after["fetches"] / max(len(done), 1), 4),
        "tier_share": window["tier_share"],
        "distinct_users": len({r.user for r in cluster.finished}),
        "engine_requests_mean": round(engine_load, 1),
        "gateway_requests_mean": round(gateway_load, 1),
        "open_at_end": cluster.open,
    }


def fit_phase(
    setup: dict[str, Any],
    target_rps: float,
    seed: int,
    pauses: Pauses | None = None,
    fetch_s: float | None = None,
    spent: Outside | None = None,
) -> tuple[float, dict]:
    """The CPU-cost factor whose simulated throughput matches ``target_rps`` (bisection on
    a log scale; throughput falls as costs grow). ``fetch_s``: the run's measured mean
    fetch, which the factor then leaves alone."""
    lo, hi = 0.2, 5.0
    best: tuple[float, dict[str, Any]] = (1.0, {})
    for _ in range(11):
        mid = float(np.sqrt(lo * hi))
        sim = simulate(setup, stalls.fetch_time(CPU.scaled(mid), fetch_s), seed, pauses, spent)
        best = (mid, sim)
        if sim["throughput_rps"] > target_rps:
            lo = mid
        else:
            hi = mid
    return best


def compare(path: Path, seed: int = 0) -> dict[str, Any]:
    """Fit, predict, and judge one recorded run."""
    real = recorded(path)
    pauses, fetch_s = stalls.load(path)
    spent = outside.load(path)
    phase, sim = fit_phase(real["setup"], real["throughput_rps"], seed, pauses, fetch_s, spent)
    checks = {
        f"routing {r}": abs(sim["routing_share"][r] - real["routing_share"][r]) <= SHARE_POINTS
        for r in real["routing_share"]
    }
    checks["store share"] = abs(sim["store_share"] - real["store_share"]) <= SHARE_POINTS
    ratio = sim["ttft_p50_ms"] / real["ttft_p50_ms"] if real["ttft_p50_ms"] else None
    checks["ttft p50"] = ratio is not None and abs(ratio - 1) <= TTFT_RATIO
    return {
        "recorded": real,
        "simulated": sim,
        "phase": round(phase, 3),
        "pauses": None
        if pauses is None
        else stalls.summary(pauses, float(str(real["setup"]["duration"]).rstrip("s"))),
        "fetch_ms": None if fetch_s is None else round(1000 * fetch_s, 1),
        "outside_ms": None
        if spent is None
        else {
            "client": round(1000 * float(np.mean(spent.client_s)), 1),
            "slot": round(1000 * spent.slot_mean_s, 1),
        },
        "ttft_p50_ratio": round(ratio, 3) if ratio else None,
        "checks": checks,
        "agrees": all(checks.values()),
    }
