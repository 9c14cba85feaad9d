"""Start a simulated cluster as one that has run for hours, not from empty caches.

A minute of simulated traffic cannot fill disk caches that hold thousands of adapters per
worker, so before the clock starts each worker's tiers get the adapters whose rendezvous
favourite it is, most popular youngest (disk up to its budget, host memory and slots up to
their counts), and it reports them as resolved; each gateway's registry cache gets the users
of a stream of past requests. The warm-up window of every scenario then lets spills and
recent traffic settle before anything is measured.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from bench.scale_sim.cluster import Cluster
from bench.scale_sim.workload import Population


def top_choice(keys: Sequence[str], workers: Sequence[str]) -> np.ndarray:
    """For each key the index of ``rendezvous_order(key, workers)[0]``: the same hash
    (blake2b-64 of ``key\\0worker``, highest first), without sorting every order."""
    encoded = [w.encode() for w in workers]
    out = np.empty(len(keys), dtype=np.int64)
    for i, key in enumerate(keys):
        prefix = hashlib.blake2b(f"{key}\0".encode(), digest_size=8)
        best, best_k = b"", 0
        for k, w in enumerate(encoded):
            h = prefix.copy()
            h.update(w)
            d = h.digest()
            if d > best:
                best, best_k = d, k
        out[i] = best_k
    return out


_HOMES: dict[tuple[str, ...], dict[str, int]] = {}


def homes(keys: list[str], workers: tuple[str, ...]) -> np.ndarray:
    """:func:`top_choice`, remembered per membership: every scenario of a run starts from
    the same workers and mostly the same adapters."""
    known = _HOMES.setdefault(workers, {})
    missing = [k for k in keys if k not in known]
    known.update(zip(missing, top_choice(missing, workers).tolist()))
    return np.array([known[k] for k in keys], dtype=np.int64)


def prewarm(cluster: Cluster, pop: Population, history: int = 40_000) -> None:
    """Fill tiers and registry caches as described in the module docstring."""
    urls = [u for u in cluster.endpoints if cluster.workers[u].role != "decode"]
    weight = pop.adapter_weight()
    order = np.argsort(-weight, kind="stable")
    config = cluster.opt.worker
    per_disk = max(1, config.disk_bytes // cluster.profile.adapter_bytes)
    # Only adapters that can be cached anywhere: the most popular ones up to the fleet's disk.
    order = order[: min(len(order), per_disk * len(urls))]
    order = order[weight[order] > 0]
    home = homes([pop.sha(int(a)) for a in order], tuple(urls))
    for k, url in enumerate(urls):
        worker = cluster.workers[url]
        mine = [pop.sha(int(a)) for a in order[home == k][:per_disk]]
        for sha in reversed(mine):
            worker.disk.insert(sha, cluster.profile.adapter_bytes)
            worker.reported.add(sha)
        for sha in reversed(mine[: worker.host.capacity]):
            worker.host.add(sha)
        for sha in reversed(mine[: worker.slots.capacity]):
            worker.slots.add(sha)
    rng = np.random.default_rng([cluster.opt.seed, 5])
    # each gateway's cache holds its own clients' users (about ``history`` lookups each)
    for user in rng.choice(pop.n_users, size=history * len(cluster.gateways), p=pop.user_weight):
        cluster.gateways[cluster.gateway_of(int(user))].target(int(user))
    for gw in cluster.gateways:
        gw.redis.clear()
