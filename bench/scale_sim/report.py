"""Tables, the goals check, the sizing table and the plot of a simulator run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from bench.results import RECORDED
from bench.scale_sim.model import PROFILES
from bench.scale_sim.workload import Population, Shape, open_loop

# What an operator sizes for (named in docs/scale.md).
PEAK_REQUESTS_PER_USER_S = 0.001  # 3.6 requests per user-hour at the daily peak
USERS_PER_ADAPTER = 10
GATEWAY_CORE_SHARE = 0.6  # a gateway replica (one core) runs at most this busy
WARM_TARGET = 0.90
HOST_COPIES = 1.2  # a hot adapter's host-memory copies across workers (spills)
REDIS_BYTES_PER_USER = 180  # binding key + value + the adapter's user-set member
REDIS_BYTES_PER_ADAPTER = 1200  # adapter hash, version entry, blob hash, index member
HOST_SLOTS = (64, 256, 512, 1024, 2048)  # --max-cpu-loras values of the host-memory table
# The engine benchmark a CPU worker's capacity is read from (docs/benchmarks.md): PreFT-LoRA,
# 512 rank-16 adapters, 8 slots, one engine on the 2-CPU VM.
ENGINE_BENCH = RECORDED / "engine_bench_512.json"
ENGINE_BENCH_HOST = RECORDED / "engine_bench_smollm2-135m-instruct.json"


def lora_bytes(
    layers: int, hidden: int, kv: int, intermediate: int, rank: int, mlp: bool, dtype_bytes: int
) -> int:
    """Host memory of one LoRA adapter as vLLM parses it: A (rank x in) and B (out x rank)
    per target, q,k,v,o (and gate, up, down with ``mlp``) in every layer."""
    pairs = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden)]
    if mlp:
        pairs += [(hidden, intermediate), (hidden, intermediate), (intermediate, hidden)]
    return layers * rank * sum(a + b for a, b in pairs) * dtype_bytes


def adapter_sizes() -> dict[str, int]:
    """Bytes per adapter held in host memory: measured by the engine benchmark (its
    ``adapter_host_bytes`` over its adapters), and Llama 3.1 8B's from its shape at the
    chart's ``maxLoraRank`` 16 in bf16 (the GPU worker's dtype)."""
    out = {}
    for label, path in (
        ("bench-llama r16 q,k,v,o (measured)", ENGINE_BENCH),
        ("SmolLM2-135M r16 q,k,v,o fp32 (measured)", ENGINE_BENCH_HOST),
    ):
        runs = json.loads(path.read_text())["runs"]
        run = next(r for r in runs if r["mode"] == "preft-lora" and r["adapters"] == 512)
        out[label] = run["adapter_host_bytes"] // run["adapters"]
    for label, mlp in (
        ("Llama 3.1 8B r16 q,k,v,o bf16", False),
        ("Llama 3.1 8B r16 all linear bf16", True),
    ):
        out[label] = lora_bytes(32, 4096, 1024, 14336, 16, mlp, 2)
    return out


def host_memory_run(slots: int, zipf_s: float) -> str:
    """The scenario name of a steady run at ``slots`` host slots and Zipf ``zipf_s``."""
    return f"cpu_loras_{slots}" + ("" if zipf_s == 1.0 else f"_s{zipf_s}")


def host_memory(scenarios: dict[str, dict[str, Any]], chart_slots: int) -> list[dict[str, Any]]:
    """One row per ``--max-cpu-loras``: host memory it takes per adapter size, and the
    simulated warm-hit share and busiest worker at each Zipf exponent (the chart's value is
    the ``steady`` runs')."""
    sizes = adapter_sizes()
    rows = []
    for slots in HOST_SLOTS:
        row: dict[str, Any] = {
            "max_cpu_loras": slots,
            "chart": slots == chart_slots,
            "host_gib": {k: slots * b / 2**30 for k, b in sizes.items()},
            "bytes_per_adapter": sizes,
        }
        for z in (0.8, 1.0, 1.2):
            name = (
                ("steady" if z == 1.0 else f"steady_s{z}")
                if slots == chart_slots
                else host_memory_run(slots, z)
            )
            w = scenarios.get(name, {}).get("windows", {}).get("measured")
            row[f"warm_hit_s{z}"] = None if w is None else w["warm_hit"]
            row[f"ttft_p99_ms_s{z}"] = None if w is None else w["ttft_p99_ms"]
        rows.append(row)
    return rows


def host_memory_table(rows: list[dict[str, Any]]) -> str:
    sizes = list(rows[0]["host_gib"])
    lines = [
        "| --max-cpu-loras | "
        + " | ".join(f"host GiB, {k} ({rows[0]['bytes_per_adapter'][k]:,} B)" for k in sizes)
        + " | warm hit, Zipf 0.8 / 1.0 / 1.2 | TTFT p99 ms, Zipf 0.8 / 1.0 / 1.2 |",
        "|---:|" + "---:|" * len(sizes) + "---|---|",
    ]
    for r in rows:
        warm = " / ".join(
            "not run" if r[f"warm_hit_s{z}"] is None else f"{r[f'warm_hit_s{z}']:.2%}"
            for z in (0.8, 1.0, 1.2)
        )
        p99 = " / ".join(str(r[f"ttft_p99_ms_s{z}"]) for z in (0.8, 1.0, 1.2))
        name = f"**{r['max_cpu_loras']}** (chart)" if r["chart"] else str(r["max_cpu_loras"])
        gib = " | ".join(f"{r['host_gib'][k]:.2f}" for k in sizes)
        lines.append(f"| {name} | {gib} | {warm} | {p99} |")
    return "\n".join(lines)


def measured_capacity(scale: Any, seed: int) -> dict[str, dict[str, Any]]:
    """Requests a second one worker serves. CPU: the engine benchmark's PreFT-LoRA
    throughput (prompt and output tokens a second, ``ENGINE_BENCH``) over the mean tokens
    of one request of the simulated workload (the linear step model's exchange rate: a
    token is a token). GPU: not measured here; the GPU profile's steady load."""
    runs = json.loads(ENGINE_BENCH.read_text())["runs"]
    run = next(
        r
        for r in runs
        if r["mode"] == "preft-lora" and r["adapters"] == 512 and r["max_loras"] == 8
    )
    pop = Population(20_000, 2_000, 20, scale.zipf_s, seed)
    sample = open_loop(pop, np.random.default_rng([seed, 9]), 100.0, 0.0, 600.0, Shape())
    tokens = float(np.mean(sample.prompt + sample.output))
    return {
        "cpu": {
            "rps": run["total_tokens_per_s"] / tokens,
            "tokens_per_s": run["total_tokens_per_s"],
            "tokens_per_request": round(tokens, 1),
            "source": f"{ENGINE_BENCH.name}: preft-lora, 512 adapters, max_loras 8",
        },
        "gpu": {
            "rps": scale.rps / scale.workers,
            "source": "modelled (no GPU engine benchmark): the GPU profile's steady load",
        },
    }


def row(name: str, w: dict[str, Any]) -> str:
    """One markdown table row of a window's headline numbers."""
    lat = w.get("others_latency") or w
    cells = [
        name,
        f"{w['rps']:.0f}",
        f"{w['warm_hit']:.1%}",
        " / ".join(f"{w['tier_share'][t]:.0%}" for t in ("slot", "host", "disk", "store")),
        " / ".join(f"{w['routing_share'][r]:.0%}" for r in ("resident", "preferred", "spill")),
        f"{w['load_max_over_mean']}",
        f"{lat['ttft_p50_ms']} / {lat['ttft_p99_ms']}",
        f"{w['cold_loads_per_s']:.1f}",
        f"{w['s3_gets_per_s']:.0f} / {w['s3_mb_per_s']:.0f}",
        f"{sum(w['redis_per_s'].values()):.0f}",
        str(sum(w["failed"].values())),
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| scenario, window | req/s | warm hit | slot / host / disk / store | resident / "
    "preferred / spill | load max/mean | TTFT p50 / p99 ms | cold loads/s | S3 GET/s / "
    "MB/s | Redis cmd/s | failed |\n|---|---:|---:|---|---|---:|---|---:|---|---:|---:|"
)


def scenario_table(scenarios: dict[str, dict[str, Any]]) -> str:
    lines = [HEADER]
    for name, res in scenarios.items():
        for window, w in res["windows"].items():
            lines.append(row(f"{name}, {window}", w))
    return "\n".join(lines)


def events_table(scenarios: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| scenario | event | adapters moved | traffic moved | bound (k/N + 2%) | recovery s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, res in scenarios.items():
        for ev in res["events"]:
            if "adapters_moved" in ev:
                single = ev["added"] <= 1 or ev["removed"] <= 1
                bound = f"{ev['bound']:.2%}" if single else "-"
                recovery = res.get("recovery_s")
                lines.append(
                    f"| {name} | {ev['event']} | {ev['adapters_moved']:.2%} | "
                    f"{ev['traffic_moved']:.2%} | {bound} | "
                    f"{'-' if recovery is None else f'{recovery:g}'} |"
                )
    return "\n".join(lines)


NOT_RUN = {"value": None, "met": None, "status": "not run"}


def goals(scenarios: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The targets at 100 workers x 1M users x 100k adapters, against the runs of the
    product as configured (``steady`` and its Zipf variants, the chart's host memory). A
    target whose scenario did not run says so (``met`` None, "not run"), never met."""
    out: dict[str, Any] = {}
    for name in ("steady", "steady_s0.8", "steady_s1.2"):
        if name not in scenarios:
            out[f"warm_hit ({name})"] = out[f"load_max_over_mean ({name})"] = NOT_RUN
            continue
        w = scenarios[name]["windows"]["measured"]
        out[f"warm_hit ({name})"] = {
            "value": w["warm_hit"],
            "target": ">= 0.90",
            "met": w["warm_hit"] >= WARM_TARGET,
        }
        out[f"load_max_over_mean ({name})"] = {
            "value": w["load_max_over_mean"],
            "requests_max_over_mean": w["requests_max_over_mean"],
            "target": "<= 1.25",
            "met": (w["load_max_over_mean"] or 9) <= 1.25,
        }
    moves = [
        ev
        for res in scenarios.values()
        for ev in res["events"]
        if "adapters_moved" in ev and ev["added"] + ev["removed"] == 1
    ]
    out["moved_per_single_change"] = (
        NOT_RUN
        if not moves
        else {
            "value": max(ev["adapters_moved"] for ev in moves),
            "target": "<= 1/N + 2%",
            "met": all(ev["adapters_moved"] <= ev["bound"] for ev in moves),
        }
    )
    for name in ("cold_storm", "cold_storm_gpu", "cold_storm_gpu_resolver8"):
        if name not in scenarios:
            out[f"others_ttft_p99 ({name})"] = NOT_RUN
            continue
        storm = scenarios[name]
        ratio = storm.get("others_ttft_p99_ratio")
        out[f"others_ttft_p99 ({name})"] = {
            "value": ratio,
            "target": "<= 2x the same load with the storm's adapters warm",
            "met": ratio is not None and ratio <= 2.0,
            "others_ttft_p99_ms": storm.get("others_ttft_p99_ms"),
            "storm_requests": storm.get("storm_requests"),
        }
    return out


def hot_set(pop: Population, share: float) -> int:
    """Adapters carrying ``share`` of the traffic, most popular first."""
    w = np.sort(pop.adapter_weight())[::-1]
    return int(np.searchsorted(np.cumsum(w) / w.sum(), share) + 1)


def sizing(
    users: int,
    profile_name: str,
    per_worker_rps: float,
    pop: Population,
    s3_mb_per_request: float,
    gets_per_request: float,
    redis_per_request: float,
    min_cpu_loras: int,
) -> dict[str, Any]:
    """One row of the operator's table (formulas in docs/scale.md); ``min_cpu_loras``: the
    chart's host memory, below which a smaller share of the hot set fits than the target
    needs (host memory is an LRU, not the hot set itself)."""
    profile = PROFILES[profile_name]
    rps = users * PEAK_REQUESTS_PER_USER_S
    adapters = max(1, users // USERS_PER_ADAPTER)
    workers = max(2, math.ceil(rps / per_worker_rps))
    hot = hot_set(pop, WARM_TARGET)
    cpu_loras = max(min_cpu_loras, 2 ** math.ceil(math.log2(max(1, hot * HOST_COPIES / workers))))
    gateways = max(2, math.ceil(rps * profile.gateway_cpu_s / GATEWAY_CORE_SHARE))
    redis_mb = (users * REDIS_BYTES_PER_USER + adapters * REDIS_BYTES_PER_ADAPTER) / 1e6
    return {
        "users": users,
        "profile": profile_name,
        "peak_rps": rps,
        "adapters": adapters,
        "per_worker_rps": per_worker_rps,
        "workers": workers,
        "hot_adapters_90pct": hot,
        "max_cpu_loras": cpu_loras,
        "host_memory_gib": round(cpu_loras * profile.adapter_bytes / 2**30, 1),
        "gateways": gateways,
        "registry_replicas": 2,
        "redis_memory_mb": round(redis_mb),
        "redis_cmds_per_s": round(rps * redis_per_request),
        "s3_gets_per_s": round(rps * gets_per_request, 1),
        "s3_mb_per_s": round(rps * s3_mb_per_request, 1),
    }


def sizing_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| users | profile | peak req/s | adapters | req/s a worker | workers | "
        "--max-cpu-loras (host GiB) | gateways | registry | Redis MB | Redis cmd/s | S3 GET/s "
        "| S3 MB/s | simulated warm hit | simulated busiest / mean |",
        "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        warm, busiest = r.get("simulated_warm_hit"), r.get("simulated_load_max_over_mean")
        lines.append(
            f"| {r['users']:,} | {r['profile']} | {r['peak_rps']:g} | "
            f"{r['adapters']:,} | {r['per_worker_rps']:.4g} | {r['workers']} | "
            f"{r['max_cpu_loras']} ({r['host_memory_gib']}) | {r['gateways']} | "
            f"{r['registry_replicas']} | {r['redis_memory_mb']} | {r['redis_cmds_per_s']} | "
            f"{r['s3_gets_per_s']} | {r['s3_mb_per_s']} | "
            f"{'not simulated' if warm is None else f'{warm:.2%}'} | "
            f"{'-' if busiest is None else busiest} |"
        )
    return "\n".join(lines)


def pools_table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| configuration | workers | warm hit | TTFT p50 / p99 ms | inter-token p50 ms | "
        "latency p50 / p99 ms | load max/mean, adapter / decode pool | cold loads/s |",
        "|---|---:|---:|---|---:|---|---|---:|",
    ]
    for r in runs:
        w = r["windows"]["measured"]
        lines.append(
            f"| {r['what']} | {r['workers'] + r['decode_workers']} | "
            f"{w['warm_hit']:.1%} | {w['ttft_p50_ms']} / {w['ttft_p99_ms']} | "
            f"{w['inter_token_p50_ms']} | {w['latency_p50_ms']} / "
            f"{w['latency_p99_ms']} | {w['load_max_over_mean']} / "
            f"{w['decode_load_max_over_mean'] or '-'} | {w['cold_loads_per_s']:.1f} |"
        )
    return "\n".join(lines)


def validation_table(checks: list[dict[str, Any]]) -> str:
    lines = [
        "| recorded run | phase | replayed pauses, fetch ms, outside ms (client / slot) "
        "| req/s | "
        "resident real / sim | preferred real / sim | spill real / sim | "
        "store fetch real / sim | TTFT p50 ms real / sim (ratio) | agrees |",
        "|---|---:|---|---:|---|---|---|---|---|---|",
    ]
    for c in checks:
        real, sim = c["recorded"], c["simulated"]
        shares = [
            f"{real['routing_share'][r]:.1%} / {sim['routing_share'][r]:.1%}"
            for r in ("resident", "preferred", "spill")
        ]
        pauses, spent = c.get("pauses"), c.get("outside_ms")
        measured = ", ".join(
            [
                "-"
                if pauses is None
                else f"{pauses['pauses']} ("
                + " / ".join(f"{x:.0%}" for x in pauses["paused_share"])
                + " of the run)",
                "-" if c.get("fetch_ms") is None else str(c["fetch_ms"]),
                "-" if spent is None else f"{spent['client']} / {spent['slot']}",
            ]
        )
        lines.append(
            f"| `{real['file']}` | {c['phase']} | {measured} | "
            f"{real['throughput_rps']} | " + " | ".join(shares) + f" | {real['store_share']:.1%} / "
            f"{sim['store_share']:.1%} | {real['ttft_p50_ms']} / {sim['ttft_p50_ms']}"
            f" ({c['ttft_p50_ratio']}) | {'yes' if c['agrees'] else 'no'} |"
        )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scen = result["scenarios"]
    fig, axes = plt.subplots(2, 3, figsize=(19, 9))
    names = [n for n in scen if "measured" in scen[n]["windows"] or "after" in scen[n]["windows"]]
    ax = axes[0][0]
    warm = [
        scen[n]["windows"].get("measured", scen[n]["windows"].get("after"))["warm_hit"]
        for n in names
    ]
    ax.barh(names, warm, color="tab:blue")
    ax.axvline(WARM_TARGET, color="tab:red", ls="--", label="goal 90%")
    ax.set(xlabel="warm-hit share (measured / after window)", title="warm hits")
    ax.legend()
    ax = axes[0][1]
    loads = [
        scen[n]["windows"].get("measured", scen[n]["windows"].get("after"))["load_max_over_mean"]
        or 0
        for n in names
    ]
    ax.barh(names, loads, color="tab:orange")
    ax.axvline(1.25, color="tab:red", ls="--", label="goal 1.25")
    ax.set(xlabel="max / mean worker load", title="load balance")
    ax.legend()
    ax = axes[0][2]
    checks = result["validation"]
    labels, real, sim = [], [], []
    for k, c in enumerate(checks):
        for r in ("resident", "preferred"):
            labels.append(f"run{k} {r}")
            real.append(c["recorded"]["routing_share"][r])
            sim.append(c["simulated"]["routing_share"][r])
        labels.append(f"run{k} store")
        real.append(c["recorded"]["store_share"])
        sim.append(c["simulated"]["store_share"])
    y = np.arange(len(labels))
    ax.barh(y - 0.2, real, 0.4, label="real")
    ax.barh(y + 0.2, sim, 0.4, label="simulated")
    ax.set_yticks(y, labels)
    ax.set(xlabel="share of requests", title="simulator vs recorded load tests")
    ax.legend()
    events = [n for n in scen if scen[n]["events"] or n in ("cold_storm", "tenant_x10")]
    for ax, key, title in (
        (axes[1][0], "warm_hit", "warm-hit share per second"),
        (axes[1][1], "ttft_p99_ms", "TTFT p99 per second (ms)"),
        (axes[1][2], "s3_fetches", "object-store fetches per second"),
    ):
        for n in events:
            series = scen[n]["timeline"][key]
            ax.plot(range(len(series)), [np.nan if v is None else v for v in series], label=n, lw=1)
        ax.set(xlabel="simulated time (s)", title=title)
        if key == "ttft_p99_ms":
            ax.set_yscale("log")
    axes[1][0].legend(fontsize=7)
    fig.suptitle(f"scale simulator ({result['command']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
