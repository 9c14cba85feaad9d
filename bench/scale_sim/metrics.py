"""From a finished run to numbers: a window's summary, a per-second timeline, recovery time.

Definitions (docs/scale.md): a **warm hit** is a request whose serving worker held its adapter
in a fast tier (a GPU slot or host memory) when it arrived; **tiers** say where it was found
(``inflight``: a load of it was already under way there); **load** is a worker's requests
running or queued, sampled every 0.5 s; TTFT is arrival at a gateway to the first token.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np

from bench.scale_sim.cluster import Cluster
from bench.scale_sim.worker import TIERS, WARM_TIERS, Req
from bench.stats import percentile

ROUTES = ("resident", "preferred", "replica", "spill")


def snapshot(cluster: Cluster) -> dict[str, Any]:
    """Cumulative counters now (a window's numbers are the difference of two)."""
    workers = [*cluster.workers.values(), *cluster.gone.values(), *cluster.retired]
    redis: Counter[str] = Counter()
    for gw in cluster.gateways:
        for cmd, n in gw.redis.items():
            redis[f"gateway {cmd}"] += n
    for (component, cmd), n in cluster.redis.items():
        redis[f"{component} {cmd}"] += n
    return {
        "t": cluster.t,
        "redis": dict(redis),
        "s3_gets": sum(w.s3_gets for w in workers),
        "s3_bytes": sum(w.s3_bytes for w in workers),
        "fetches": sum(len(w.fetches) for w in workers),
        "parses": sum(w.parses for w in workers),
        "load_sum": dict(cluster.load_sum),
        "load_n": dict(cluster.load_n),
    }


def _ms(values: list[float], q: float) -> float | None:
    v = percentile(values, q)
    return None if v is None else round(1000 * v, 1)


def latency(reqs: list[Req], stream_only: bool = False) -> dict[str, float | None]:
    done = [r for r in reqs if r.state == "done" and (r.stream or not stream_only)]
    ttft = [r.first - r.t0 for r in done]
    e2e = [r.done - r.t0 for r in done]
    itl = [(r.done - r.first) / (r.output - 1) for r in done if r.output > 1]
    return {
        "ttft_p50_ms": _ms(ttft, 50),
        "ttft_p99_ms": _ms(ttft, 99),
        "latency_p50_ms": _ms(e2e, 50),
        "latency_p99_ms": _ms(e2e, 99),
        "inter_token_p50_ms": _ms(itl, 50),
    }


def summarize(
    cluster: Cluster, start: float, end: float, before: dict[str, Any], after: dict[str, Any]
) -> dict[str, Any]:
    """Requests that arrived in ``[start, end)``; counters between the two snapshots."""
    reqs = [r for r in cluster.finished if start <= r.t0 < end]
    seconds = max(after["t"] - before["t"], 1e-9)
    done = [r for r in reqs if r.state == "done"]
    tiers = Counter(r.tier for r in done if r.tier)
    served = sum(tiers.values()) or 1
    routes = Counter(r.route for r in done)
    routed = sum(routes.values()) or 1
    loads, decode_loads = [], []
    for url, n in after["load_n"].items():
        samples = n - before["load_n"].get(url, 0)
        if samples > 0:
            mean = (after["load_sum"][url] - before["load_sum"].get(url, 0)) / samples
            (decode_loads if url.startswith("http://d") else loads).append(mean)
    per_worker = Counter(r.worker for r in done)
    counts = list(per_worker.values())
    redis = {
        k: round((after["redis"].get(k, 0) - before["redis"].get(k, 0)) / seconds, 1)
        for k in sorted(set(after["redis"]) | set(before["redis"]))
    }
    out: dict[str, Any] = {
        "requests": len(reqs),
        "done": len(done),
        "failed": dict(Counter(r.error for r in reqs if r.state == "failed")),
        "retried": sum(1 for r in reqs if r.retries),
        "rps": round(len(reqs) / max(end - start, 1e-9), 1),
        "tier_share": {t: round(tiers[t] / served, 4) for t in TIERS},
        "warm_hit": round(sum(tiers[t] for t in WARM_TIERS) / served, 4),
        "routing_share": {r: round(routes[r] / routed, 4) for r in ROUTES},
        "load_mean": round(float(np.mean(loads)), 2) if loads else None,
        "load_max_over_mean": (
            round(max(loads) / float(np.mean(loads)), 3) if loads and np.mean(loads) > 0 else None
        ),
        "requests_max_over_mean": (
            round(max(counts) / float(np.mean(counts)), 3) if counts else None
        ),
        "decode_load_max_over_mean": (
            round(max(decode_loads) / float(np.mean(decode_loads)), 3) if decode_loads else None
        ),
        **latency(reqs),
        "cold_loads_per_s": round((after["fetches"] - before["fetches"]) / seconds, 2),
        "disk_loads_per_s": round(tiers["disk"] / seconds, 2),
        "s3_gets_per_s": round((after["s3_gets"] - before["s3_gets"]) / seconds, 2),
        "s3_mb_per_s": round((after["s3_bytes"] - before["s3_bytes"]) / seconds / 1e6, 2),
        "redis_per_s": redis,
    }
    return out


def timeline(cluster: Cluster, end: float) -> dict[str, list[float | None]]:
    """Per second of arrival: requests, warm-hit share, TTFT p99, failures, S3 fetches."""
    seconds = math.ceil(end)
    bins: list[list[Req]] = [[] for _ in range(seconds)]
    for r in cluster.finished:
        k = int(r.t0)
        if 0 <= k < seconds:
            bins[k].append(r)
    fetch_bins = np.zeros(seconds)
    for w in (*cluster.workers.values(), *cluster.gone.values(), *cluster.retired):
        idx = np.asarray(w.fetches, dtype=np.int64)
        idx = idx[(idx >= 0) & (idx < seconds)]
        np.add.at(fetch_bins, idx, 1)
    warm, p99, failed = [], [], []
    for b in bins:
        served = [r for r in b if r.state == "done" and r.tier]
        warm.append(
            round(sum(r.tier in WARM_TIERS for r in served) / len(served), 4) if served else None
        )
        p99.append(_ms([r.first - r.t0 for r in b if r.state == "done"], 99))
        failed.append(sum(r.state == "failed" for r in b))
    return {
        "requests": [len(b) for b in bins],
        "warm_hit": warm,
        "ttft_p99_ms": p99,
        "failed": failed,
        "s3_fetches": [int(x) for x in fetch_bins],
    }


def recovery_s(
    line: dict[str, list[Any]], event: float, base: tuple[float, float], hold: int = 5
) -> float | None:
    """Seconds from ``event`` until ``hold`` consecutive seconds have a warm-hit share within
    2 points of the baseline window's, TTFT p99 within 1.5x of it and no failures; None if
    that never happens in the run."""
    a, b = int(base[0]), int(base[1])
    warm = [w for w in line["warm_hit"][a:b] if w is not None]
    p99 = [p for p in line["ttft_p99_ms"][a:b] if p is not None]
    if not warm or not p99:
        return None
    warm_ok, p99_ok = float(np.mean(warm)) - 0.02, 1.5 * float(np.median(p99))
    run = 0
    for k in range(int(event), len(line["warm_hit"])):
        w, p, f = line["warm_hit"][k], line["ttft_p99_ms"][k], line["failed"][k]
        good = w is not None and w >= warm_ok and p is not None and p <= p99_ok and not f
        run = run + 1 if good else 0
        if run >= hold:
            return float(k - hold + 1 - event) if k - hold + 1 > event else 0.0
    return None
