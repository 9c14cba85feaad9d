"""Cluster-scale simulation of preft-serve, driven by the product's own decision code.

Routing is the gateway's ``WorkerPool`` (one per simulated gateway, each with its own
in-flight counts, health and polled resident sets), the registry lookup is the registry
client's ``ResolveCache``, the worker's adapter tiers mirror the LRU policies of vLLM and
``AdapterDiskCache``; only time is modelled (``--profile``: ``cpu`` measured here, ``gpu``
modelled from the model's shape and the paper's ratios). Simulates, never sleeps.

Default run (100 workers, 10 gateways, 1M users, 100k adapters, ~1,000 req/s): steady state
at Zipf s = 0.8 / 1.0 / 1.2, scale-out 10 -> 20, a lost worker, a rolling upgrade, a cold
storm of 50k new users, one tenant x10, a hot swap of 10k adapters, the GPU profile, the two
pools against unified workers, host memory per --max-cpu-loras, the sizing runs, and the
check against the recorded 2,000-adapter load tests (exit status 1 if the one-worker or the
two-worker reference run disagrees). Writes ``--out`` (.json and .png) and prints markdown tables.

    python -m bench.scale_sim                       # everything, ~10 minutes
    python -m bench.scale_sim --quick               # small cluster, every scenario, ~1 minute
    python -m bench.scale_sim --scenario worker_loss --profile gpu --out /tmp/gpu_loss
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.results import add_result_dir, result_path
from bench.scale_sim import report, scenarios, validate
from bench.scale_sim.model import GPU, PROFILES
from bench.scale_sim.scenarios import CHART_WORKER, QUICK, Scale
from bench.scale_sim.workload import Population

# Sized configurations simulated up to this many workers (the prewarm hashes every adapter
# against every worker in Python: minutes at several hundred workers).
MAX_SIZED_WORKERS = 200
EXTRA = (
    "steady_s0.8",
    "steady_s1.2",
    "steady_gpu",
    "cold_storm_gpu",
    "host_memory",
    "own_share_cap",
    "two_pools",
    "sizing",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.scale_sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="10 workers, 3 gateways, 20k users, 2k adapters, 100 req/s, short "
        "windows (every scenario, ~1 minute; no sizing; the chart's host memory then holds "
        "every adapter, so its warm-hit goal says nothing about the full size); writes "
        "scale_sim_quick.* unless --out",
    )
    p.add_argument("--seed", type=int, default=0, help="same seed, same JSON")
    p.add_argument(
        "--out", type=Path, help="output path without suffix (default RESULT_DIR/scale_sim)"
    )
    add_result_dir(p)
    p.add_argument(
        "--scenario",
        action="append",
        choices=[*scenarios.SCENARIOS, *EXTRA, "validate"],
        help="run only these (repeatable); default all",
    )
    p.add_argument(
        "--profile",
        choices=list(PROFILES),
        default="cpu",
        help="service times of the scenarios (the GPU profile also runs as "
        "steady_gpu and two_pools)",
    )
    p.add_argument(
        "--no-validate",
        action="store_true",
        help="skip the comparison with the recorded load tests",
    )
    p.add_argument(
        "--recorded",
        type=Path,
        action="append",
        help="a load-test summary (<out>_summary.json of bench.loadtest) to "
        "check the simulator against, instead of the recorded ones (repeatable; "
        "its setup may name 'workers')",
    )
    p.add_argument(
        "--hot-replicas",
        type=int,
        help="PREFT_GATEWAY_HOT_REPLICAS for every gateway (default: the "
        "gateway's default; 1 = off)",
    )
    p.add_argument("--gateways", type=int, help="gateway replicas (default: 10; --quick 3)")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = result_path(args.result_dir, "scale_sim_quick" if args.quick else "scale_sim")
    return args


def per_request(window: dict[str, Any]) -> tuple[float, float, float]:
    """S3 MB, S3 GETs and Redis commands per request in a window."""
    rps = max(window["rps"], 1e-9)
    return (
        window["s3_mb_per_s"] / rps,
        window["s3_gets_per_s"] / rps,
        sum(window["redis_per_s"].values()) / rps,
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    scale: Scale = QUICK if args.quick else Scale()
    if args.gateways is not None:
        scale = replace(scale, gateways=args.gateways)
    if args.hot_replicas is not None:
        scale = replace(scale, hot_replicas=args.hot_replicas)
    profile = PROFILES[args.profile]
    wanted = set(args.scenario or [*scenarios.SCENARIOS, *EXTRA, "validate"])
    seed = args.seed
    out: dict[str, Any] = {
        "command": "python -m bench.scale_sim"
        + (" --quick" if args.quick else "")
        + (f" --seed {seed}" if seed else "")
        + (f" --gateways {args.gateways}" if args.gateways else "")
        + "".join(f" --scenario {n}" for n in args.scenario or [])
        + (f" --hot-replicas {args.hot_replicas}" if args.hot_replicas is not None else ""),
        "seed": seed,
        "profile": profile.name,
        "scale": scale.__dict__,
        "profiles": {p.name: {"label": p.label, **p.source} for p in PROFILES.values()},
        "scenarios": {},
        "timings_s": {},
    }

    def timed(label: str, fn: Any, *a: Any, **kw: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        res = fn(*a, **kw)
        out["timings_s"][label] = round(time.perf_counter() - t0, 1)
        print(f"  {label}: {out['timings_s'][label]} s", file=sys.stderr, flush=True)
        return res

    for name, fn in scenarios.SCENARIOS.items():
        if name in wanted:
            out["scenarios"][name] = timed(name, fn, scale, profile, seed)
    for s in (0.8, 1.2):
        if f"steady_s{s}" in wanted:
            out["scenarios"][f"steady_s{s}"] = timed(
                f"steady_s{s}",
                scenarios.steady,
                replace(scale, zipf_s=s),
                profile,
                seed,
                name=f"steady_s{s}",
            )
    if "steady_gpu" in wanted and profile is not GPU:
        out["scenarios"]["steady_gpu"] = timed(
            "steady_gpu", scenarios.steady, scale, GPU, seed, name="steady_gpu"
        )
    if "cold_storm_gpu" in wanted and profile is not GPU:
        for name, worker in (
            ("cold_storm_gpu", CHART_WORKER),
            ("cold_storm_gpu_resolver8", replace(CHART_WORKER, resolver_threads=8)),
        ):
            out["scenarios"][name] = timed(
                name, scenarios.cold_storm, scale, GPU, seed, worker=worker
            )
            out["scenarios"][name]["name"] = name
    if "host_memory" in wanted:  # the chart's host memory is steady's; the others here
        for n in report.HOST_SLOTS:
            if n == CHART_WORKER.max_cpu_loras:
                continue
            for z in (0.8, 1.0, 1.2):
                name = report.host_memory_run(n, z)
                out["scenarios"][name] = timed(
                    name,
                    scenarios.steady,
                    replace(scale, zipf_s=z),
                    profile,
                    seed,
                    name=name,
                    worker=replace(CHART_WORKER, max_cpu_loras=n),
                )
    if "own_share_cap" in wanted:  # each gateway capping its own share: what it replaced
        out["scenarios"]["own_share_cap"] = timed(
            "own_share_cap",
            scenarios.steady,
            scale,
            profile,
            seed,
            name="own_share_cap",
            cap_on_worker_load=False,
        )
    if "two_pools" in wanted:
        n = scale.workers
        out["two_pools"] = [
            timed(f"pools {p}/{d}", scenarios.two_pools, scale, GPU, seed, p, d)
            for p, d in ((n, 0), (n // 2, n // 2), (n * 3 // 10, n * 4 // 10))
        ]
    if "sizing" in wanted and "steady" in out["scenarios"] and not args.quick:
        out["sizing"] = sizing(scale, out, seed)
    if "validate" in wanted and not args.no_validate:
        out["validation"] = [
            timed(f"validate {p.parent.name}/{p.name}", validate.compare, p, seed)
            for p in (args.recorded or validate.RECORDED)
        ]
    if "host_memory" in wanted:
        out["host_memory"] = report.host_memory(out["scenarios"], CHART_WORKER.max_cpu_loras)
    if out["scenarios"]:
        out["goals"] = report.goals(out["scenarios"])
    return out


def sizing(scale: Scale, out: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """The operator's table: formulas (``report.sizing``) fed with the measured per-worker
    capacity (``report.measured_capacity``) and the steady runs' per-request traffic; each
    row is then simulated at its sized configuration (CPU profile: hit rates and balance
    do not depend on it) and its warm-hit share and busiest worker recorded."""
    steady = out["scenarios"]["steady"]["windows"]["measured"]
    capacity = report.measured_capacity(scale, seed)
    out["capacity"] = capacity
    gpu = out["scenarios"].get("steady_gpu", {}).get("windows", {}).get("measured", steady)
    rows = []
    for users in (10_000, 100_000, 1_000_000):
        factor = min(1.0, users / scale.users)
        size = replace(
            scale,
            users=max(int(scale.users * factor), 1000),
            adapters=max(int(scale.adapters * factor), 100),
            tenants=max(int(scale.tenants * min(1.0, factor * 10)), 4),
            rps=scale.rps * factor,
        )
        pop = Population(size.users, size.adapters, size.tenants, size.zipf_s, seed)
        for name, window in (("cpu", steady), ("gpu", gpu)):
            mb, gets, redis = per_request(window)
            row = report.sizing(
                users,
                name,
                capacity[name]["rps"],
                pop,
                mb,
                gets,
                redis,
                CHART_WORKER.max_cpu_loras,
            )
            rows.append(row)
            sized = (row["workers"], row["gateways"], row["max_cpu_loras"])
            if sized == (scale.workers, scale.gateways, CHART_WORKER.max_cpu_loras) and (
                factor == 1.0
            ):
                w: dict[str, Any] | None = steady  # the steady run is this configuration
            elif row["workers"] <= MAX_SIZED_WORKERS:
                w = scenarios.steady(
                    replace(size, workers=row["workers"], gateways=row["gateways"]),
                    PROFILES["cpu"],
                    seed,
                    name=f"sizing_{users}_{name}",
                    worker=replace(CHART_WORKER, max_cpu_loras=row["max_cpu_loras"]),
                )["windows"]["measured"]
            else:
                w = None  # not simulated: see MAX_SIZED_WORKERS
            row["simulated_warm_hit"] = None if w is None else w["warm_hit"]
            row["simulated_load_max_over_mean"] = None if w is None else w["load_max_over_mean"]
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    result = run(args)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    timings = result.pop("timings_s")
    seconds = result.pop("seconds")
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    if result["scenarios"] and result.get("validation"):
        report.plot(result, args.out.with_suffix(".png"))
    print(report.scenario_table(result["scenarios"]))
    print()
    print(report.events_table(result["scenarios"]))
    for key, fmt in (
        ("validation", report.validation_table),
        ("host_memory", report.host_memory_table),
        ("sizing", report.sizing_table),
    ):
        if result.get(key):
            print()
            print(fmt(result[key]))
    if result.get("two_pools"):
        print()
        print(report.pools_table(result["two_pools"]))
    if result.get("goals"):
        print()
        print(json.dumps(result["goals"], indent=1))
    print(f"\n{seconds} s ({json.dumps(timings)}); wrote {args.out}.json, .png", file=sys.stderr)
    checks = result.get("validation", [])
    required = {validate.recorded(path)["file"] for path in validate.REQUIRED} if checks else ()
    ok = all(c["agrees"] for c in checks if c["recorded"]["file"] in required)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
