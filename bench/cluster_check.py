"""The gateway's cluster routing, run for real on loopback, against the scale simulator.

Starts real Redis, the real registry, ``--gateways`` real gateway processes (settings at
their defaults, which the chart deploys; static worker list) and ``--workers`` fake
workers (``bench/fake_cluster_worker.py``: an LRU of resident adapters reported in
``/v1/models``, vLLM's load gauges in ``/metrics``, a modelled service time). Seeds a
bounded workload into the registry through its own write path (``queue_version`` /
``queue_binding``, as ``bench/registry_bench.py`` does): the simulator's ``Population``
(same users, adapters, tenants, Zipf exponent and seed, so the same adapter hashes), each
worker prewarmed with the adapters whose rendezvous favourite it is (as
``scale_sim.prewarm`` does). The load is the simulator's own request stream
(``workload.open_loop``: conversations, Poisson arrivals), replayed by an asyncio httpx
client in which each user keeps to one gateway (``Cluster.gateway_of``, as HTTP
keep-alive does) -- not locust: a fixed replay keeps both sides on the same requests.

Measured from the parts' own numbers: routing shares (the gateways'
``preft_gateway_routing_total`` by result, summed over gateways), the workers' load
(running requests sampled every 0.5 s by each worker: busiest / mean) and requests per
worker (busiest / mean), over the measured window. Then one worker leaves (stops
answering: the gateways' health checks take it out, which static discovery supports
without a restart; changing the list would need a gateway restart), and the workers'
per-adapter counts say what moved (``observed_moves``): the leaver's share of the
traffic, against the simulator's ``moved`` (the popularity share of adapters whose
rendezvous favourite it was, over the same URLs), and how many other adapters' requests
went to a worker new to them beyond the churn of a window without a leave (rendezvous
says none). The simulator's ``steady`` scenario runs in-process on the same workload;
both are printed side by side. Agreement: within 5 points on shares, 10 % on ratios.

What it does not show: loopback (no network latency or loss), fake service times (the
simulator's own CPU-profile medians, so service time is not what is being checked), every
part on one small machine (2 cores here: the gateways' polls and the client compete with
each other, so loads read late), no all-token cost, no queueing inside a worker, and a
worker that leaves by closing its port rather than a lost node.

    python -m bench.cluster_check                            # 10 gateways x 50 workers
    python -m bench.cluster_check --measure-s 60 --rps 40    # shorter
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import re
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis

from bench.results import ROOT, add_result_dir, result_path
from bench.scale_sim import scenarios
from bench.scale_sim.gateway import product_settings
from bench.scale_sim.model import CPU
from bench.scale_sim.prewarm import top_choice
from bench.scale_sim.scenarios import CHART_WORKER, Scale, moved
from bench.scale_sim.workload import Population, Requests, Shape, open_loop
from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.onebox import OneBox, StackConfig, StackError, free_port
from preft_serve.onebox.seed import create_tenant
from preft_serve.onebox.stack import http_ok
from preft_serve.registry.adapters import queue_version
from preft_serve.registry.bindings import queue_binding
from preft_serve.registry.schemas import AdapterVersion

ROUTES = ("resident", "preferred", "replica", "spill")
SHARE_TOLERANCE = 0.05  # absolute, on shares
RATIO_TOLERANCE = 0.10  # relative, on ratios
MAX_WORKERS = 100
ROUTING = "preft_gateway_routing_total"
PER_PROCESS = 10  # fake workers per process


@dataclass(frozen=True)
class Row:
    metric: str
    kind: str  # "share" or "ratio"
    cluster: float | None
    simulator: float | None

    @property
    def difference(self) -> float | None:
        if self.cluster is None or self.simulator is None:
            return None
        if self.kind == "share":
            return self.cluster - self.simulator
        return (self.cluster - self.simulator) / self.simulator if self.simulator else math.inf

    @property
    def agrees(self) -> bool | None:
        d = self.difference
        if d is None:
            return None
        return abs(d) <= (SHARE_TOLERANCE if self.kind == "share" else RATIO_TOLERANCE) + 1e-9


def compare(cluster: dict[str, Any], simulator: dict[str, Any]) -> list[Row]:
    """The rows of the side-by-side table: routing shares and moves (shares, within 5
    points) and load ratios (within 10 %). Either side may lack a number (None)."""
    rows = [
        Row(
            f"routing {r}",
            "share",
            cluster["routing_share"].get(r),
            simulator["routing_share"].get(r),
        )
        for r in ROUTES
    ]
    rows += [
        Row(key, kind, cluster.get(key), simulator.get(key))
        for key, kind in (
            ("load_max_over_mean", "ratio"),
            ("requests_max_over_mean", "ratio"),
            ("traffic_moved", "share"),
            ("others_moved", "share"),
        )
    ]
    return rows


def table(rows: list[Row]) -> str:
    def num(x: float | None, kind: str, diff: bool = False) -> str:
        if x is None:
            return "-"
        if kind == "share":
            return f"{100 * x:+.1f} pt" if diff else f"{100 * x:.1f} %"
        return f"{100 * x:+.1f} %" if diff else f"{x:.3f}"

    out = [
        "| metric | cluster | simulator | difference | agrees |",
        "|---|---:|---:|---:|:---:|",
    ]
    for r in rows:
        ok = {True: "yes", False: "**no**", None: "-"}[r.agrees]
        out.append(
            f"| {r.metric} | {num(r.cluster, r.kind)} | {num(r.simulator, r.kind)} | "
            f"{num(r.difference, r.kind, diff=True)} | {ok} |"
        )
    return "\n".join(out)


def routing_share(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Shares of each routing result between two sums of the gateways' counters."""
    counts = {r: after.get(r, 0.0) - before.get(r, 0.0) for r in ROUTES}
    total = sum(counts.values()) or 1.0
    return {r: round(n / total, 4) for r, n in counts.items()}


def worker_ratios(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """Busiest / mean of the workers' sampled load and of requests served, between two
    snapshots of every worker's ``/bench/stats``."""
    loads, counts = [], []
    for url, a in after.items():
        b = before.get(url, {"load_sum": 0.0, "load_n": 0, "served": {}})
        n = a["load_n"] - b["load_n"]
        if n > 0:
            loads.append((a["load_sum"] - b["load_sum"]) / n)
        counts.append(sum(a["served"].values()) - sum(b["served"].values()))
    mean_load, mean_count = float(np.mean(loads)), float(np.mean(counts))
    return {
        "load_mean": round(mean_load, 3),
        "load_max_over_mean": round(max(loads) / mean_load, 3) if mean_load > 0 else None,
        "requests_max_over_mean": round(max(counts) / mean_count, 3) if mean_count > 0 else None,
    }


def served_between(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> dict[str, Counter[str]]:
    """Per adapter sha: requests per worker URL between two snapshots."""
    out: dict[str, Counter[str]] = {}
    for url, a in after.items():
        b = before.get(url, {}).get("served", {})
        for sha, n in a["served"].items():
            if (d := n - b.get(sha, 0)) > 0:
                out.setdefault(sha, Counter())[url] += d
    return out


def new_worker_share(
    before: dict[str, Counter[str]], after: dict[str, Counter[str]], skip: set[str]
) -> float | None:
    """Of the second window's requests for adapters served in the first (less those in
    ``skip``), the share that went to a worker which served none of that adapter's
    requests in the first: an adapter moving, or a spill or a hot adapter's replica
    landing somewhere new."""
    total = new = 0
    for sha, where in after.items():
        if sha in skip or sha not in before:
            continue
        total += where.total()
        new += sum(n for url, n in where.items() if url not in before[sha])
    return round(new / total, 4) if total else None


def observed_moves(
    first: dict[str, Counter[str]],
    second: dict[str, Counter[str]],
    after: dict[str, Counter[str]],
    leaver: str,
) -> dict[str, Any]:
    """What one worker leaving moved, from where requests went in three windows: two
    halves of the measured window (``first``, ``second``: no change between them) and
    ``after`` the leave.

    * ``traffic_moved``: the leaver's share of the measured requests, which had to go
      elsewhere (the simulator: the popularity share of adapters whose rendezvous
      favourite it was).
    * ``others_moved``: for every other adapter, the share of requests after the leave
      that went to a worker new to it, less the same share between the two halves
      (hot-adapter replicas and spills move requests all the time); rendezvous hashing
      says the leave itself moves none of them.

    The busiest worker per adapter says nothing here: hot-adapter replication spreads
    every adapter over a few per mille of the traffic over several workers."""
    before = {s: first.get(s, Counter()) + second.get(s, Counter()) for s in {*first, *second}}
    total = sum(c.total() for c in before.values())
    on_leaver = {s for s, c in before.items() if c[leaver] > 0}
    churn = new_worker_share(first, second, on_leaver)
    moved_others = new_worker_share(before, after, on_leaver)
    return {
        "traffic_moved": round(sum(c[leaver] for c in before.values()) / total, 4)
        if total
        else None,
        "others_moved": None
        if churn is None or moved_others is None
        else round(max(0.0, moved_others - churn), 4),
        "others_new_worker_after": moved_others,
        "others_new_worker_no_leave": churn,
        "adapters_on_leaver": len(on_leaver),
    }


# -- the real cluster -------------------------------------------------------------------------


def seed_registry(stack: OneBox, pop: Population) -> list[str]:
    """Tenants over REST (their API keys), adapters and bindings straight into Redis through
    the registry's own queueing functions. Returns the API key per tenant index."""
    names = [f"cc-t{t}" for t in range(pop.n_tenants)]
    api_keys = [create_tenant(stack.registry_url, stack.admin_token, n) for n in names]
    keys, now = RegistryKeys(), dt.datetime.now(dt.UTC).isoformat()
    client = redis.Redis.from_url(stack.redis_url)
    pipe = client.pipeline(transaction=False)
    maxlen = 10 * (pop.n_adapters + pop.n_users)
    for a in range(pop.n_adapters):
        rec = AdapterVersion(
            name=f"a{a}",
            version=1,
            sha256=pop.sha(a),
            type=AdapterType.LORA,
            rank=4,
            mode=AdapterMode.ALL if pop.adapter_all[a] else AdapterMode.PREFILL,
            base_model="fake-base",
            size_bytes=CPU.adapter_bytes,
            created_at=now,
        )
        queue_version(pipe, keys, names[pop.adapter_tenant[a]], rec, now, maxlen)
        if len(pipe) >= 2000:
            pipe.execute()
    for u in range(pop.n_users):
        tenant = names[pop.user_tenant[u]]
        queue_binding(pipe, keys, tenant, f"u{u}", f"a{pop.user_adapter[u]}", None, maxlen)
        if len(pipe) >= 2000:
            pipe.execute()
    pipe.execute()
    client.close()
    return api_keys


def start_workers(stack: OneBox, count: int, say: Any) -> list[str]:
    """``count`` fake workers, :data:`PER_PROCESS` to a process, each on a port its
    process picked; their URLs."""
    env = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = []
    for k in range(0, count, PER_PROCESS):
        ports_file = stack.config.run_dir / f"fake-workers-{k // PER_PROCESS}.ports"
        ports_file.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "bench.fake_cluster_worker"]
        argv += ["--count", str(min(PER_PROCESS, count - k)), "--ports-file", str(ports_file)]
        argv += ["--max-loras", str(CHART_WORKER.max_loras)]
        argv += ["--max-cpu-loras", str(CHART_WORKER.max_cpu_loras)]
        started.append((stack.start(f"fake-workers-{k // PER_PROCESS}", argv, env), ports_file))
    urls: list[str] = []
    for child, ports_file in started:
        child.wait_ready(ports_file.exists, 60, 0.1)
        urls += [f"http://127.0.0.1:{p}" for p in json.loads(ports_file.read_text())]
    say(f"  {count} fake workers up in {len(started)} processes")
    return urls


def prewarm_workers(pop: Population, urls: list[str]) -> None:
    """Each worker gets the adapters whose rendezvous favourite it is, most popular first
    (``scale_sim.prewarm``, over the real URLs)."""
    weight = pop.adapter_weight()
    order = np.argsort(-weight, kind="stable")
    order = order[weight[order] > 0]
    shas = [pop.sha(int(a)) for a in order]
    home = top_choice(shas, urls)
    for k, url in enumerate(urls):
        mine = [s for s, h in zip(shas, home, strict=True) if h == k]
        httpx.post(f"{url}/bench/prewarm", json=mine, timeout=10).raise_for_status()


def start_gateways(stack: OneBox, model: Path, workers: list[str], count: int) -> list[str]:
    """``count`` gateways, started together; one whose port was taken meanwhile (it was
    free when picked) starts again on another."""

    def start(g: int) -> tuple[Any, int]:
        port = free_port()
        argv, env = stack.gateway_command(model, workers, port)
        return stack.start(
            f"gateway-{g}", argv, {**env, "PREFT_GATEWAY_LOG_LEVEL": "warning"}
        ), port

    children = [start(g) for g in range(count)]
    urls = []
    for g, (first, first_port) in enumerate(children):
        child, port = first, first_port
        try:
            child.wait_ready(http_ok(f"http://127.0.0.1:{port}/readyz"), 120)
        except StackError:
            if "address already in use" not in child.log_tail():
                raise
            stack.children.remove(child)
            child, port = start(g)
            child.wait_ready(http_ok(f"http://127.0.0.1:{port}/readyz"), 120)
        urls.append(f"http://127.0.0.1:{port}")
    return urls


def gateway_of(user: int, gateways: int) -> int:
    """``scale_sim.cluster.Cluster.gateway_of``: a client's keep-alive connection."""
    return ((user * 0x9E3779B1) & 0xFFFFFFFF) * gateways >> 32


async def replay(
    requests: Requests,
    gateways: list[str],
    tenant_keys: list[str],
    pop: Population,
    marks: dict[float, Any],
    say: Any,
) -> tuple[Counter[str], float]:
    """Send each request at its time to its user's gateway; at each mark's time run the
    mark's callback (in a thread beside the sending: it scrapes). Returns the statuses and
    when the replay started (``time.monotonic``)."""
    clients = [
        httpx.AsyncClient(base_url=g, timeout=60, limits=httpx.Limits(max_connections=500))
        for g in gateways
    ]
    statuses: Counter[str] = Counter()
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int) -> None:
        user = int(requests.user[i])
        body = {
            "prompt": [1] * int(requests.prompt[i]),
            "max_tokens": int(requests.output[i]),
            "user": f"u{user}",
        }
        key = tenant_keys[pop.user_tenant[user]]
        try:
            r = await clients[gateway_of(user, len(gateways))].post(
                "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            statuses[str(r.status_code)] += 1
        except httpx.HTTPError as exc:
            statuses[type(exc).__name__] += 1

    start = time.monotonic()
    pending = sorted(marks.items())
    marking: list[asyncio.Task[None]] = []
    next_say = 10.0
    for i in range(len(requests)):
        t = float(requests.t[i])
        while pending and pending[0][0] <= t:
            at, fn = pending.pop(0)
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            marking.append(asyncio.create_task(asyncio.to_thread(fn)))
        await asyncio.sleep(max(0.0, start + t - time.monotonic()))
        if t >= next_say:
            say(f"  t={t:.0f} s: {i} sent, {len(tasks)} open, {dict(statuses)}")
            next_say += 10.0
        task = asyncio.create_task(one(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    for at, fn in pending:
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        marking.append(asyncio.create_task(asyncio.to_thread(fn)))
    await asyncio.gather(*marking)
    if tasks:
        await asyncio.wait(tasks, timeout=60)
    for c in clients:
        await c.aclose()
    return statuses, start


ROUTING_LINE = re.compile(rb'^preft_gateway_routing_total\{result="(\w+)"\} (\S+)$', re.M)


def routing_counts(gateway: str) -> dict[str, float]:
    """The gateway's routing counter by result, found in its ``/metrics`` page by one
    regular expression (the page is large, with per-adapter series: parsing it in Python
    at each mark, beside the client, took tens of seconds on a loaded machine)."""
    return routing_in_page(httpx.get(f"{gateway}/metrics", timeout=30).content)


def routing_in_page(page: bytes) -> dict[str, float]:
    out: dict[str, float] = {}
    for result, value in ROUTING_LINE.findall(page):
        out[result.decode()] = out.get(result.decode(), 0.0) + float(value)
    return out


def worker_stats(worker: str) -> dict[str, Any] | None:
    try:
        return dict(httpx.get(f"{worker}/bench/stats", timeout=30).json())
    except httpx.HTTPError:
        return None  # a worker that left


def snapshot(gateways: list[str], workers: list[str]) -> dict[str, Any]:
    """Every gateway's routing counts and every worker's stats, fetched side by side."""
    with ThreadPoolExecutor(16) as pool:
        routes_each = list(pool.map(routing_counts, gateways))
        stats = dict(zip(workers, pool.map(worker_stats, workers), strict=True))
    routes: Counter[str] = Counter()
    for counts in routes_each:
        routes.update(counts)
    return {
        "t": time.monotonic(),
        "routes": dict(routes),
        "workers": {w: st for w, st in stats.items() if st is not None},
    }


def run_cluster(
    args: argparse.Namespace, pop: Population, requests: Requests, say: Any
) -> dict[str, Any]:
    from preft_serve.toymodels import make_model  # imports torch

    var = args.var.resolve()
    config = StackConfig(
        var=var, redis_port=free_port(), registry_port=free_port(), gateway_port=free_port()
    )
    stack = OneBox(config, say=lambda line: None)
    try:
        model = make_model("tiny-llama", var / "model").resolve()
        stack.start_redis()
        stack.start_registry(model)
        t0 = time.monotonic()
        tenant_keys = seed_registry(stack, pop)
        say(
            f"  seeded {pop.n_adapters} adapters, {pop.n_users} users "
            f"in {time.monotonic() - t0:.1f} s"
        )
        workers = start_workers(stack, args.workers, say)
        prewarm_workers(pop, workers)
        gateways = start_gateways(stack, model, workers, args.gateways)
        say(f"  {len(gateways)} gateways ready")
        w, m = args.warm_s, args.measure_s
        leave = w + m
        victim = workers[len(workers) // 3]
        snaps: dict[str, dict[str, Any]] = {}

        def mark(name: str) -> Any:
            def fn() -> None:
                snaps[name] = snapshot(gateways, workers)
                say(f"  mark {name}")

            return fn

        def leave_now() -> None:
            snaps["leave"] = snapshot(gateways, workers)
            httpx.post(f"{victim}/bench/leave", timeout=10)
            say(f"  worker {victim} left")

        gw = product_settings()  # what the gateways run with
        settle = (gw.unhealthy_after + 1) * gw.health_interval_s  # taken out, and a margin
        marks = {
            w: mark("start"),
            w + m / 2: mark("mid"),
            leave: leave_now,
            leave + settle: mark("settled"),
        }
        end = leave + args.after_s
        statuses, started = asyncio.run(replay(requests, gateways, tenant_keys, pop, marks, say))
        snaps["end"] = snapshot(gateways, workers)
        dead = stack.dead_child()
        if dead is not None:
            raise dead.failure("exited during the run")
        measured = {
            "routing_share": routing_share(snaps["start"]["routes"], snaps["leave"]["routes"]),
            **worker_ratios(snaps["start"]["workers"], snaps["leave"]["workers"]),
            "seconds": round(snaps["leave"]["t"] - snaps["start"]["t"], 1),
            # when each mark's reading finished (a loaded machine makes them late)
            "marks_s": {k: round(v["t"] - started, 1) for k, v in snaps.items()},
        }
        measured.update(
            observed_moves(
                served_between(snaps["start"]["workers"], snaps["mid"]["workers"]),
                served_between(snaps["mid"]["workers"], snaps["leave"]["workers"]),
                served_between(snaps["settled"]["workers"], snaps["end"]["workers"]),
                victim,
            )
        )
        measured["statuses"] = dict(statuses)
        measured["victim"] = victim
        measured["workers"] = workers
        measured["end_s"] = end
        return measured
    finally:
        stack.stop()


def run_simulator(args: argparse.Namespace, cluster: dict[str, Any]) -> dict[str, Any]:
    """The simulator's ``steady`` scenario on the same workload (no diurnal swing), and its
    ``moved`` for the cluster's leave (every adapter, by popularity, over the same URLs)."""
    scale = Scale(
        users=args.users,
        adapters=args.adapters,
        tenants=args.tenants,
        workers=args.workers,
        gateways=args.gateways,
        rps=args.rps,
        zipf_s=args.zipf,
        warm_s=args.warm_s,
        measure_s=args.measure_s,
        swing=0.0,
    )
    res = scenarios.steady(scale, CPU, args.seed, name="cluster_check")
    out = {
        k: res["windows"]["measured"][k]
        for k in (
            "routing_share",
            "load_max_over_mean",
            "requests_max_over_mean",
            "load_mean",
            "warm_hit",
        )
    }
    pop = Population(args.users, args.adapters, args.tenants, args.zipf, args.seed)
    weight = pop.adapter_weight()
    live = np.flatnonzero(weight > 0)
    workers, victim = cluster["workers"], cluster["victim"]
    out.update(
        moved(
            [pop.sha(int(a)) for a in live],
            weight[live],
            workers,
            [u for u in workers if u != victim],
        )
    )
    out["others_moved"] = 0.0  # rendezvous: only the leaver's adapters change favourite
    return out


def workload(args: argparse.Namespace) -> tuple[Population, Requests]:
    """The simulator's population and request stream (``scenarios.Run``'s draws)."""
    pop = Population(
        args.users, args.adapters, args.tenants, args.zipf, args.seed, all_fraction=0.2
    )
    shape = Shape()
    end = args.warm_s + args.measure_s + args.after_s
    rng = np.random.default_rng([args.seed, 4])
    reqs = open_loop(pop, rng, args.rps, 0, end, shape, lead_s=6 * shape.think_s * shape.turns)
    return pop, Requests.merge([reqs])  # arrival order


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(9, 4))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["cluster"] or 0 for r in rows], 0.4, label="cluster (real processes)")
    ax.bar(x + 0.2, [r["simulator"] or 0 for r in rows], 0.4, label="simulator")
    ax.set_xticks(x, [r["metric"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_title(result["command"], fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.cluster_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--gateways", type=int, default=10, help="gateway processes (default 10)")
    p.add_argument(
        "--workers", type=int, default=50, help=f"fake workers (default 50, at most {MAX_WORKERS})"
    )
    p.add_argument("--users", type=int, default=20_000, help="users (default 20,000)")
    p.add_argument("--adapters", type=int, default=2_000, help="adapters (default 2,000)")
    p.add_argument("--tenants", type=int, default=20, help="tenants (default 20)")
    p.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent over users (default 1.0)")
    p.add_argument("--rps", type=float, default=60.0, help="mean requests a second (default 60)")
    p.add_argument("--warm-s", type=float, default=30.0, help="unmeasured warm-up (default 30 s)")
    p.add_argument("--measure-s", type=float, default=90.0, help="measured window (default 90 s)")
    p.add_argument(
        "--after-s", type=float, default=40.0, help="after a worker leaves (default 40 s)"
    )
    p.add_argument("--seed", type=int, default=0, help="the workload's seed (both sides)")
    p.add_argument(
        "--var", type=Path, default=ROOT / "var" / "cluster_check", help="state, logs, model"
    )
    p.add_argument(
        "--out", type=Path, help="output path without suffix (default RESULT_DIR/cluster_check)"
    )
    add_result_dir(p)
    args = p.parse_args(argv)
    if not 1 <= args.workers <= MAX_WORKERS:
        p.error(f"--workers must be 1 to {MAX_WORKERS}")
    if args.out is None:
        args.out = result_path(args.result_dir, "cluster_check")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    command = "python -m bench.cluster_check " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    pop, requests = workload(args)
    say(
        f"[1/3] cluster: {args.gateways} gateways x {args.workers} workers, "
        f"{len(requests)} requests"
    )
    try:
        cluster = run_cluster(args, pop, requests, say)
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    say("[2/3] simulator, same workload")
    sim = run_simulator(args, cluster)
    rows = compare(cluster, sim)
    result = {
        "command": command.strip(),
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end",
        "setup": {k: v for k, v in vars(args).items() if k not in ("out", "result_dir", "var")},
        "cluster": {k: v for k, v in cluster.items() if k != "workers"},
        "simulator": sim,
        "rows": [{**r.__dict__, "difference": r.difference, "agrees": r.agrees} for r in rows],
        "agrees": all(r.agrees is not False for r in rows),
        "not_shown": "loopback, fake service times (the simulator's CPU medians), every part "
        "on one machine, no all-token cost or worker queueing, a worker leaving by closing "
        "its port",
    }
    say("[3/3] results")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(table(rows))
    print(f"\nrequests: {cluster['statuses']}; not shown: {result['not_shown']}")
    print(f"wrote {args.out}.json, .png", file=sys.stderr)
    return 0 if result["agrees"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
