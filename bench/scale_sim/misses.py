"""What the store fetches of one steady run are: could routing have avoided them?

A request whose adapter comes from the object store is a cold load. This sorts the measured
window's store fetches by what the cluster held when the gateway chose the worker: the
adapter warm (host memory or a slot) on another worker, and how far that worker's load was
past the gateway's cap (the load every choice is held against); only on another worker's
disk; or nowhere (compulsory: no routing avoids it). It also counts the adapter's first
request since the run began and a fetch of an adapter the same worker fetched before in the
run (a re-fetch after its disk cache evicted it). Instrumentation only: it wraps the
simulator's routing and arrival while one run lasts, and the run is the one
``python -m bench.scale_sim --scenario steady_sS`` makes.

    python -m bench.scale_sim.misses --seed 2 --gateways 3 --zipf 0.8 [--resident-slack 0]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from bench.scale_sim import cluster as cluster_module
from bench.scale_sim import scenarios
from bench.scale_sim.model import PROFILES
from bench.scale_sim.worker import Req, SimWorker
from preft_serve.gateway import proxy
from preft_serve.gateway.routing import WorkerPool, rendezvous_order

# (worker, its load as the gateway saw it, reported resident, warm, on disk), in the key's
# rendezvous order over the healthy workers
Seen = list[tuple[str, int, bool, bool, bool]]


class Misses:
    """Store fetches of requests that arrived in ``[start, end)``, by cause."""

    def __init__(self, start: float, end: float, resident_slack: int | None = None) -> None:
        self.start, self.end, self.resident_slack = start, end, resident_slack
        self.cluster: cluster_module.Cluster | None = None
        self.routing: Req | None = None
        self.chosen: dict[int, tuple[int, Seen, str]] = {}  # request id -> cap, seen, result
        self.requested: set[str] = set()
        self.fetched: defaultdict[str, set[str]] = defaultdict(set)
        self.tiers: Counter[str] = Counter()
        self.causes: Counter[str] = Counter()
        self.past_cap: Counter[int] = Counter()  # the least loaded warm holder's load - cap

    def take_route(
        self,
        pool: WorkerPool,
        key: str,
        cold_tenant: str | None = None,
        prefill_hop: bool = False,
    ) -> Any:
        req, cluster = self.routing, self.cluster
        assert req is not None and cluster is not None
        healthy = pool.healthy()
        cap = pool.cap(healthy)
        seen: Seen = []
        for url in rendezvous_order(key, healthy):
            worker, status = cluster.workers.get(url), pool.status[url]
            warm = worker is not None and (key in worker.host or key in worker.slots)
            disk = worker is not None and key in worker.disk
            seen.append((url, status.load, key in status.resident, warm, disk))
        route = proxy.take_route(pool, key, cold_tenant, prefill_hop)
        self.chosen[req.id] = (cap, seen, route.choice.result.value)
        return route

    def arrived(self, worker: SimWorker, req: Req) -> None:
        first = req.sha not in self.requested
        self.requested.add(req.sha)
        measured = self.start <= req.t0 < self.end
        if measured:
            self.tiers[req.tier] += 1
        if req.tier != "store":
            return
        again = req.sha in self.fetched[worker.url]
        self.fetched[worker.url].add(req.sha)
        if not measured:
            return
        cap, seen, result = self.chosen[req.id]
        c = self.causes
        c["store"] += 1
        c[f"routed {result}"] += 1
        c["first request of the adapter in the run"] += first
        c["re-fetch on the same worker"] += again
        others = [s for s in seen if s[0] != worker.url]
        warm = [s for s in others if s[3]]
        if warm:
            c["warm on another worker"] += 1
            c["warm on its rendezvous favourite"] += seen[0][0] != worker.url and seen[0][3]
            self.past_cap[min(s[1] for s in warm) - cap] += 1
        elif any(s[4] for s in others):
            c["only on another worker's disk"] += 1
        else:
            c["nowhere (compulsory)"] += 1

    def report(self) -> dict[str, Any]:
        served = sum(self.tiers.values()) or 1
        store = self.causes["store"] or 1
        past = dict(sorted(self.past_cap.items()))
        return {
            "served": served,
            "tiers": {t: round(n / served, 4) for t, n in sorted(self.tiers.items())},
            "store_fetches": self.causes["store"],
            "causes": {k: [n, round(n / store, 4)] for k, n in sorted(self.causes.items())},
            "warm_holder_load_past_cap": {
                "under the cap": sum(n for d, n in past.items() if d < 0),
                **{f"cap + {d}": n for d, n in past.items() if d >= 0},
            },
        }


@contextmanager
def watching(misses: Misses) -> Iterator[None]:
    """Wrap the simulator's routing and arrival for the length of one run."""
    route, take, arrive = (
        cluster_module.Cluster.route,
        cluster_module.take_route,
        SimWorker.arrive,
    )

    def routed(self: Any, req: Req, gw: Any, delay: float, tries: int = 0) -> None:
        misses.cluster, misses.routing = self, req
        if misses.resident_slack is not None:
            gw.pool.resident_slack = misses.resident_slack
        route(self, req, gw, delay, tries)

    def arrived(self: SimWorker, req: Req, t: float) -> float | None:
        wake = arrive(self, req, t)
        if self.role != "decode":
            misses.arrived(self, req)
        return wake

    cluster_module.Cluster.route = routed  # type: ignore[method-assign]
    cluster_module.take_route = misses.take_route
    SimWorker.arrive = arrived  # type: ignore[method-assign]
    try:
        yield
    finally:
        cluster_module.Cluster.route = route  # type: ignore[method-assign]
        cluster_module.take_route = take
        SimWorker.arrive = arrive  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gateways", type=int, default=10)
    parser.add_argument("--zipf", type=float, default=0.8)
    parser.add_argument("--warm-s", type=float, default=None, help="unmeasured warm-up")
    parser.add_argument(
        "--resident-slack", type=int, default=None, help="the pools' (default: the product's)"
    )
    args = parser.parse_args()
    scale = replace(scenarios.Scale(), gateways=args.gateways, zipf_s=args.zipf)
    if args.warm_s is not None:
        scale = replace(scale, warm_s=args.warm_s)
    misses = Misses(scale.warm_s, scale.warm_s + scale.measure_s, args.resident_slack)
    with watching(misses):
        result = scenarios.steady(scale, PROFILES["cpu"], args.seed, name=f"steady_s{args.zipf}")
    window = result["windows"]["measured"]
    out = {
        "seed": args.seed,
        "gateways": args.gateways,
        "zipf": args.zipf,
        "warm_s": scale.warm_s,
        "resident_slack": args.resident_slack,
        "warm_hit": window["warm_hit"],
        "load_max_over_mean": window["load_max_over_mean"],
        "ttft_p50_ms": window["ttft_p50_ms"],
        "ttft_p99_ms": window["ttft_p99_ms"],
        **misses.report(),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
