"""The scenarios: one cluster run each, with what happens when, and the windows measured.

Every scenario starts from a prewarmed cluster (``prewarm.py``), lets ``warm_s`` of traffic
settle unmeasured, measures a baseline, then applies its event and measures what follows.
Times are simulated seconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from bench.scale_sim import metrics
from bench.scale_sim.cluster import Cluster, Options
from bench.scale_sim.gateway import product_settings
from bench.scale_sim.model import GIB, Profile, WorkerConfig
from bench.scale_sim.prewarm import homes, prewarm
from bench.scale_sim.workload import Population, Requests, Shape, conversations, open_loop
from preft_serve.common.registry_client import EventType, RegistryEvent
from preft_serve.gateway.routing import rendezvous_order

REGISTRY_CMDS_PER_PUBLISH = 10  # registry/adapters.py + events.py: one version's pipeline
CHART_WORKER = WorkerConfig(disk_bytes=20 * GIB, max_cpu_loras=1024)  # the chart's worker values
CHART_GATEWAYS = 2  # the chart's gateway.replicas


@dataclass(frozen=True)
class Scale:
    """Cluster size and traffic of a run."""

    users: int = 1_000_000
    adapters: int = 100_000
    tenants: int = 200
    workers: int = 100
    gateways: int = 10
    rps: float = 1000.0  # mean requests a second (1M users: one every ~17 min at peak)
    zipf_s: float = 1.0
    warm_s: float = 20.0
    measure_s: float = 40.0
    swing: float = 0.3  # diurnal swing of the steady scenarios
    all_fraction: float = 0.2
    storm_users: int = 50_000
    swap_adapters: int = 10_000
    rolling_pod_start_s: float = 0.5  # compressed: see docs/scale.md
    move_sample: int = 1000
    hot_replicas: int | None = None  # PREFT_GATEWAY_HOT_REPLICAS (None: the gateway's default)


QUICK = Scale(
    users=20_000,
    adapters=2_000,
    tenants=20,
    workers=10,
    gateways=3,
    rps=100.0,
    warm_s=10.0,
    measure_s=20.0,
    storm_users=1_000,
    swap_adapters=200,
    move_sample=2_000,
)


class Run:
    """One cluster, its traffic and its measurement marks."""

    def __init__(
        self,
        name: str,
        scale: Scale,
        profile: Profile,
        seed: int,
        *,
        worker: WorkerConfig = CHART_WORKER,
        workers: int | None = None,
        decode_workers: int = 0,
        pop: Population | None = None,
        shape: Shape | None = None,
        cap_on_worker_load: bool | None = None,
    ) -> None:
        """``cap_on_worker_load``: ``PREFT_GATEWAY_CAP_ON_WORKER_LOAD`` (None: the
        gateway's default)."""
        self.name, self.scale, self.profile, self.seed = name, scale, profile, seed
        self.shape = shape or Shape()
        self.pop = pop or Population(
            scale.users,
            scale.adapters,
            scale.tenants,
            scale.zipf_s,
            seed,
            all_fraction=scale.all_fraction,
        )
        changes: dict[str, Any] = {}
        if scale.hot_replicas is not None:
            changes["hot_replicas"] = scale.hot_replicas
        if cap_on_worker_load is not None:
            changes["cap_on_worker_load"] = cap_on_worker_load
        self.cluster = Cluster(
            self.pop,
            Options(
                profile,
                worker,
                product_settings(**changes),
                workers or scale.workers,
                scale.gateways,
                decode_workers,
                seed=seed,
            ),
        )
        prewarm(self.cluster, self.pop)
        self.rng = np.random.default_rng([seed, 4])
        self.parts: list[Requests] = []
        self.marks: dict[float, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}

    def traffic(
        self,
        start: float,
        end: float,
        rps: float | None = None,
        users: np.ndarray | None = None,
        swing: float = 0.0,
    ) -> None:
        lead = 6 * self.shape.think_s * self.shape.turns if start == 0 else 0.0
        self.parts.append(
            open_loop(
                self.pop,
                self.rng,
                rps or self.scale.rps,
                start,
                end,
                self.shape,
                swing=swing,
                day_s=end - start,
                users=users,
                lead_s=lead,
            )
        )

    def mark(self, *times: float) -> None:
        for t in times:
            self.cluster.at(
                t, lambda t=t: self.marks.__setitem__(t, metrics.snapshot(self.cluster))
            )

    def go(self, end: float) -> None:
        self.cluster.run(Requests.merge(self.parts), end)
        self.end = end

    def window(
        self, a: float, b: float, tenants: set[int] | None = None, exclude: set[int] | None = None
    ) -> dict[str, Any]:
        out = metrics.summarize(self.cluster, a, b, self.marks[a], self.marks[b])
        for label, keep in (("tenants", tenants), ("others", exclude)):
            if keep is None:
                continue
            pick = [
                r
                for r in self.cluster.finished
                if a <= r.t0 < b
                and ((r.tenant in keep) if label == "tenants" else (r.tenant not in keep))
            ]
            out[f"{label}_latency"] = metrics.latency(pick)
        return out

    def result(self, windows: dict[str, dict[str, Any]], what: str) -> dict[str, Any]:
        c = self.cluster
        return {
            "name": self.name,
            "what": what,
            "profile": self.profile.name,
            "scale": asdict(self.scale),
            "worker": asdict(c.opt.worker),
            "workers": c.opt.workers,
            "decode_workers": c.opt.decode_workers,
            "requests_total": c.next_id,
            "requests_open_at_end": c.open,
            "windows": windows,
            "events": self.events,
            **self.extra,
            "timeline": metrics.timeline(c, self.end),
        }


def moved(
    keys: list[str], weights: np.ndarray, before: list[str], after: list[str]
) -> dict[str, float]:
    """Share of ``keys`` (and of their traffic) whose rendezvous favourite differs between
    two memberships, computed with the product's ``rendezvous_order``."""
    change = np.array(
        [rendezvous_order(k, before)[0] != rendezvous_order(k, after)[0] for k in keys]
    )
    added = len(set(after) - set(before))
    removed = len(set(before) - set(after))
    n = max(len(before), len(after))
    return {
        "adapters_moved": round(float(change.mean()), 4),
        "traffic_moved": round(float(weights[change].sum() / weights.sum()), 4),
        "workers_before": len(before),
        "workers_after": len(after),
        "added": added,
        "removed": removed,
        "bound": round((added + removed) / n + 0.02, 4),
    }


def move_sample(run: Run) -> tuple[list[str], np.ndarray]:
    """Keys to measure movement on: a uniform sample of adapters (traffic-weighted)."""
    rng = np.random.default_rng([run.seed, 6])
    pick = rng.choice(
        run.pop.n_adapters, size=min(run.scale.move_sample, run.pop.n_adapters), replace=False
    )
    return [run.pop.sha(int(a)) for a in pick], run.pop.adapter_weight()[pick]


def _urls(run: Run) -> list[str]:
    return list(run.cluster.endpoints)


# -- scenarios ------------------------------------------------------------------------------


def steady(
    scale: Scale,
    profile: Profile,
    seed: int,
    name: str = "steady",
    worker: WorkerConfig = CHART_WORKER,
    cap_on_worker_load: bool | None = None,
) -> dict[str, Any]:
    """``cap_on_worker_load``: ``PREFT_GATEWAY_CAP_ON_WORKER_LOAD`` (None: the gateway's
    default)."""
    run = Run(name, scale, profile, seed, worker=worker, cap_on_worker_load=cap_on_worker_load)
    w, m = scale.warm_s, scale.measure_s
    run.traffic(0, w + m, swing=scale.swing)
    run.mark(w, w + m)
    run.go(w + m)
    return run.result(
        {"measured": run.window(w, w + m)},
        f"steady state, Zipf s={scale.zipf_s}, diurnal swing ±{scale.swing:.0%}",
    )


def scale_out(scale: Scale, profile: Profile, seed: int) -> dict[str, Any]:
    """10 -> 20 workers under load (the new pods become ready together)."""
    small = max(2, scale.workers // 10)
    rps = scale.rps * small / scale.workers * 2
    run = Run("scale_out", scale, profile, seed, workers=small)
    w, b = scale.warm_s, scale.measure_s / 2
    event = w + b
    end = event + scale.measure_s
    run.traffic(0, end, rps=rps)
    before = _urls(run)
    keys, weights = move_sample(run)

    def grow() -> None:
        for k in range(small, 2 * small):
            run.cluster.add_worker(f"w{k}", "unified", ready=True)
        run.events.append(
            {
                "t": event,
                "event": f"{small} workers added",
                **moved(keys, weights, before, _urls(run)),
            }
        )

    run.cluster.at(event + 1e-3, grow)
    run.mark(w, event, end)
    run.go(end)
    out = run.result(
        {"before": run.window(w, event), "after": run.window(event, end)},
        f"scale-out {small} -> {2 * small} workers at {rps:.0f} req/s",
    )
    out["recovery_s"] = metrics.recovery_s(out["timeline"], event, (w, event))
    return out


def worker_loss(scale: Scale, profile: Profile, seed: int) -> dict[str, Any]:
    run = Run("worker_loss", scale, profile, seed)
    w, b = scale.warm_s, scale.measure_s / 2
    event = w + b
    end = event + scale.measure_s
    run.traffic(0, end)
    keys, weights = move_sample(run)
    before = _urls(run)
    victim = before[len(before) // 3]

    def lose() -> None:
        run.cluster.lose(victim)
        after = [u for u in before if u != victim]
        run.events.append(
            {"t": event, "event": f"node of {victim} lost", **moved(keys, weights, before, after)}
        )

    run.cluster.at(event + 1e-3, lose)
    run.mark(w, event, event + 10, end)
    run.go(end)
    out = run.result(
        {
            "before": run.window(w, event),
            "first_10s": run.window(event, event + 10),
            "after": run.window(event, end),
        },
        "one worker's node lost",
    )
    out["recovery_s"] = metrics.recovery_s(out["timeline"], event, (w, event))
    return out


def rolling_upgrade(scale: Scale, profile: Profile, seed: int) -> dict[str, Any]:
    """Every worker replaced in turn (maxUnavailable 1, maxSurge 0): the old pod terminates,
    its replacement (a new pod, a new address) is ready ``rolling_pod_start_s`` later."""
    run = Run("rolling_upgrade", scale, profile, seed)
    w, b = scale.warm_s, scale.measure_s / 2
    start = w + b
    step = scale.rolling_pod_start_s
    n = scale.workers
    finish = start + n * step
    end = finish + scale.measure_s
    run.traffic(0, end)
    keys, weights = move_sample(run)
    first = _urls(run)

    def replace_one(k: int) -> None:
        before = _urls(run)
        old = next(u for u in before if u.startswith(f"http://w{k}."))
        run.cluster.terminate(old)
        run.cluster.add_worker(f"w{k}", "unified", start_s=step * 0.999)
        if k < 2:  # each replacement is alike: measure the first two
            run.events.append(
                {
                    "t": run.cluster.t,
                    "event": f"w{k} removed",
                    **moved(keys, weights, before, [u for u in before if u != old]),
                }
            )

    for k in range(n):
        run.cluster.at(start + k * step, lambda k=k: replace_one(k))
    run.cluster.at(
        finish,
        lambda: run.events.append(
            {"t": finish, "event": "upgrade done", **moved(keys, weights, first, _urls(run))}
        ),
    )
    run.mark(w, start, finish, end)
    run.go(end)
    out = run.result(
        {
            "before": run.window(w, start),
            "during": run.window(start, finish),
            "after": run.window(finish, end),
        },
        f"rolling upgrade of all {n} workers, one every {step:g} s (compressed)",
    )
    out["recovery_s"] = metrics.recovery_s(out["timeline"], finish, (w, start))
    return out


def cold_storm(
    scale: Scale, profile: Profile, seed: int, worker: WorkerConfig = CHART_WORKER
) -> dict[str, Any]:
    """``storm_users`` new users of a new tenant, each with a new adapter, arrive within a
    minute; each sends one first message (their later turns are not part of the storm).
    Then the control: the same traffic with only the storm requests the cluster served,
    their adapters already warm on their workers (the same load, no cold loads). The ratio
    is the other tenants' TTFT p99 through the storm over theirs through the control."""
    out, served = _storm(scale, profile, seed, worker)
    control, _ = _storm(scale, profile, seed, worker, warm_users=served)
    others = out["windows"]["storm"]["others_latency"]["ttft_p99_ms"]
    warm = control["windows"]["storm"]["others_latency"]["ttft_p99_ms"]
    before = out["windows"]["before"]["others_latency"]["ttft_p99_ms"]
    out["others_ttft_p99_ms"] = {"before": before, "storm": others, "warm_control": warm}
    out["others_ttft_p99_ratio"] = round(others / warm, 3) if others and warm else None
    out["others_ttft_p99_over_before"] = round(others / before, 3) if others and before else None
    out["warm_control"] = {
        "storm": control["windows"]["storm"],
        "storm_requests": control["storm_requests"],
    }
    return out


def _storm(
    scale: Scale,
    profile: Profile,
    seed: int,
    worker: WorkerConfig,
    warm_users: np.ndarray | None = None,
) -> tuple[dict[str, Any], np.ndarray]:
    """One storm run, and the storm users it served. ``warm_users``: the control, where only
    these storm users send (at the same times) and their adapters are warm."""
    pop = Population(
        scale.users,
        scale.adapters,
        scale.tenants,
        scale.zipf_s,
        seed,
        all_fraction=scale.all_fraction,
    )
    tenant = pop.add_tenant(scale.storm_users, scale.storm_users)
    run = Run("cold_storm", scale, profile, seed, pop=pop, worker=worker)
    w, b = scale.warm_s, scale.measure_s / 2
    event = w + b
    storm_end = event + 60.0
    end = storm_end + scale.measure_s / 2
    run.traffic(0, end)
    users = np.arange(pop.n_users - scale.storm_users, pop.n_users)
    starts = np.sort(run.rng.uniform(event, storm_end, size=scale.storm_users))
    storm = conversations(run.rng, users, starts, replace(run.shape, turns=1.0), end)
    if warm_users is not None:
        _warm_tenant(run, tenant, warm_users)
        keep = np.isin(storm.user, warm_users)
        storm = Requests(*(getattr(storm, f)[keep] for f in Requests.__dataclass_fields__))
    run.parts.append(storm)
    run.mark(w, event, storm_end, end)
    run.go(end)
    out = run.result(
        {
            "before": run.window(w, event, exclude={tenant}),
            "storm": run.window(event, storm_end, tenants={tenant}, exclude={tenant}),
            "after": run.window(storm_end, end, exclude={tenant}),
        },
        f"{scale.storm_users} new users with new adapters within 60 s"
        + ("" if warm_users is None else " (control: the served ones, their adapters warm)"),
    )
    mine = [r for r in run.cluster.finished if r.tenant == tenant]
    out["storm_requests"] = {
        "sent": len(mine),
        "retried": sum(1 for r in mine if r.retries),
        "refused_after_retries": sum(1 for r in mine if r.error == "too_many_cold_loads"),
        "served": sum(1 for r in mine if r.state == "done"),
        "ttft_p99_ms": metrics.latency(mine)["ttft_p99_ms"],
    }
    out["recovery_s"] = metrics.recovery_s(out["timeline"], storm_end, (w, event))
    return out, np.array(sorted({r.user for r in mine if r.state == "done"}), dtype=np.int64)


def _warm_tenant(run: Run, tenant: int, users: np.ndarray) -> None:
    """The control of a cold storm: the adapters of ``users`` (of ``tenant``) already on
    disk, reported and in host memory of their rendezvous favourite, in host memory added
    for them (the others' adapters keep theirs)."""
    pop, cluster = run.pop, run.cluster
    urls = list(cluster.endpoints)
    adapters = sorted({int(a) for a in pop.user_adapter[users]})
    assert all(pop.adapter_tenant[a] == tenant for a in adapters)
    shas = [pop.sha(a) for a in adapters]
    home = homes(shas, tuple(urls))
    for k, url in enumerate(urls):
        worker = cluster.workers[url]
        mine = [sha for sha, h in zip(shas, home) if h == k]
        worker.host.capacity += len(mine)
        for sha in mine:
            worker.disk.insert(sha, cluster.profile.adapter_bytes)
            worker.reported.add(sha)
            worker.host.add(sha)


def tenant_x10(scale: Scale, profile: Profile, seed: int) -> dict[str, Any]:
    run = Run("tenant_x10", scale, profile, seed)
    pop = run.pop
    tenant = 2  # the third largest
    w, b = scale.warm_s, scale.measure_s / 2
    event, stop = w + b, w + b + 30.0
    end = stop + scale.measure_s / 2
    run.traffic(0, end)
    users = np.flatnonzero(pop.user_tenant == tenant)
    share = float(pop.user_weight[users].sum())
    run.traffic(event, stop, rps=9 * scale.rps * share, users=users)
    run.mark(w, event, stop, end)
    run.go(end)
    out = run.result(
        {
            "before": run.window(w, event, exclude={tenant}),
            "boost": run.window(event, stop, tenants={tenant}, exclude={tenant}),
            "after": run.window(stop, end, exclude={tenant}),
        },
        f"tenant t{tenant} ({share:.1%} of traffic) x10 for 30 s",
    )
    out["recovery_s"] = metrics.recovery_s(out["timeline"], stop, (w, event))
    return out


def hot_swap(scale: Scale, profile: Profile, seed: int) -> dict[str, Any]:
    """The largest tenant publishes a new version of ``swap_adapters`` adapters at once:
    registry events invalidate every gateway's cache entry (``ResolveCache.apply``), each
    worker's prefetcher reads the versions (HVALS) and fetches the new blob where it holds
    an old one on disk; requests then route by the new hash."""
    run = Run("hot_swap", scale, profile, seed)
    pop, cluster = run.pop, run.cluster
    w, b = scale.warm_s, scale.measure_s / 2
    event = w + b
    end = event + scale.measure_s
    run.traffic(0, end)
    rng = np.random.default_rng([seed, 7])
    mine = np.flatnonzero(pop.adapter_tenant == 0)
    swapped = rng.choice(mine, size=min(scale.swap_adapters, len(mine)), replace=False)

    def publish() -> None:
        prefetched = homed = 0
        for a in swapped:
            old = pop.sha(int(a))
            pop.version[a] += 1
            ref = pop.ref(int(a))
            event_ = RegistryEvent(
                EventType.ADAPTER_UPDATED.value,
                ref.tenant,
                adapter=ref.name,
                version=ref.version,
                sha256=ref.sha256,
            )
            for gw in cluster.gateways:
                gw.cache.apply(event_)
            cluster.redis[("registry", "publish pipeline")] += REGISTRY_CMDS_PER_PUBLISH
            home = None
            for url, worker in cluster.workers.items():
                if not worker.config.prefetch_on_update or worker.role == "decode":
                    continue
                cluster.redis[("worker", "HVALS prefetch")] += 1
                if worker.prefetch(ref.sha256, [old], cluster.t):
                    prefetched += 1
                    home = home or rendezvous_order(ref.sha256, cluster.endpoints)[0]
                    homed += url == home
        run.events.append(
            {
                "t": event,
                "event": f"{len(swapped)} adapters of t0 swapped",
                "prefetched": prefetched,
                "prefetched_on_new_home": homed,
            }
        )

    cluster.at(event + 1e-3, publish)  # after the window mark at ``event``
    run.mark(w, event, event + 10, end)
    run.go(end)
    out = run.result(
        {
            "before": run.window(w, event),
            "first_10s": run.window(event, event + 10),
            "after": run.window(event, end),
        },
        f"{len(swapped)} adapters of the largest tenant hot-swapped at once",
    )
    out["recovery_s"] = metrics.recovery_s(out["timeline"], event, (w, event))
    return out


def two_pools(
    scale: Scale, profile: Profile, seed: int, prefill: int, decode: int
) -> dict[str, Any]:
    """PreFT requests prefilled on ``prefill`` adapter workers and decoded on ``decode``
    adapter-free workers, against unified workers (``decode`` 0). PreFT traffic only: an
    all-token adapter stays whole on the prefill pool, where its slots starve prefill (the
    mixed steady runs show that on unified workers)."""
    name = f"pools_{prefill}p_{decode}d" if decode else f"unified_{prefill}"
    run = Run(
        name,
        replace(scale, all_fraction=0.0),
        profile,
        seed,
        workers=prefill,
        decode_workers=decode,
    )
    w, m = scale.warm_s, scale.measure_s
    run.traffic(0, w + m)
    run.mark(w, w + m)
    run.go(w + m)
    return run.result(
        {"measured": run.window(w, w + m)},
        f"{prefill} prefill + {decode} decode workers" if decode else f"{prefill} unified workers",
    )


SCENARIOS = {
    "steady": steady,
    "scale_out": scale_out,
    "worker_loss": worker_loss,
    "rolling_upgrade": rolling_upgrade,
    "cold_storm": cold_storm,
    "tenant_x10": tenant_x10,
    "hot_swap": hot_swap,
}
