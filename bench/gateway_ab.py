"""Before/after of a gateway change, side by side: the gateway of a git ref against the
working tree's, in one run, in front of one upstream that answers instantly.

    python -m bench.gateway_ab --before HEAD~3 [--rounds 10 --requests 400]

What runs: Redis, the registry (one tenant, bound users), ``bench/fake_worker.py`` (an
ASGI app that answers like vLLM at once), and two gateways in front of it: **now** (this
tree) and **before** (``--before``'s ``services/``, extracted with ``git archive`` and put
first on ``PYTHONPATH``). Throughput rounds rotate direct → now → before (the first of the
three rotates too); each gateway's CPU per request is its process's user+system CPU during
its own rounds. Latency: one request at a time, each sent direct, through now and through
before back to back; "added" is a gateway's latency minus direct's for the same request.
The machines are noisy, so compare the two gateways' numbers *of this run*, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.engine_ab import import_dir
from bench.gateway_bench import (
    TARGET_FAKE_CPU_MS,
    TARGET_P50_MS,
    Req,
    Target,
    direct_target,
    gateway_target,
    request_mix,
    run_batch,
    send,
)
from bench.results import add_result_dir, result_path
from bench.stack_setup import (
    make_adapters,
    seed_tenants,
    stack_main,
    start_fake_upstream,
    write_results,
)
from bench.stats import percentile
from preft_serve.onebox import OneBox, StackConfig, free_port

SIDES = ("now", "before")


async def throughput(
    targets: dict[str, Target], reqs: list[Req], rounds: int, concurrency: int, pids: dict[str, int]
) -> dict[str, Any]:
    """Rotating rounds; per gateway: req/s and its own CPU ms per request, medians."""
    names = list(targets)
    per_round: list[dict[str, float]] = []
    limits = httpx.Limits(
        max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2
    )
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        for r in range(rounds):
            order = names[r % 3 :] + names[: r % 3]
            row: dict[str, float] = {}
            for name in order:
                cpu = {side: [pid] for side, pid in pids.items() if side == name}
                got = await run_batch(client, targets[name], reqs, concurrency, cpu)
                row[f"{name}_rps"] = round(got["rps"], 1)
                if name in pids:
                    row[f"{name}_cpu_ms"] = round(got[f"{name}_cpu_ms"], 3)
            per_round.append(row)
            print(
                f"  round {r + 1}/{rounds}: "
                + ", ".join(
                    f"{n} {row[f'{n}_rps']:.0f} req/s"
                    + (f" {row[f'{n}_cpu_ms']:.2f} ms CPU/req" if n in pids else "")
                    for n in names
                ),
                flush=True,
            )
    med = statistics.median
    out: dict[str, Any] = {"rounds": per_round}
    for name in names:
        out[f"{name}_rps"] = med(row[f"{name}_rps"] for row in per_round)
    for side in pids:
        out[f"{side}_cpu_ms_per_request"] = med(row[f"{side}_cpu_ms"] for row in per_round)
    out["cpu_after_over_before"] = round(
        med(row["now_cpu_ms"] / row["before_cpu_ms"] for row in per_round), 3
    )
    return out


async def latency(targets: dict[str, Target], reqs: list[Req], pairs: int) -> dict[str, Any]:
    """Each request direct, now and before back to back (rotating order)."""
    names = list(targets)
    rows = []
    async with httpx.AsyncClient(timeout=60) as client:
        for i in range(pairs):
            req = reqs[i % len(reqs)]
            order = names[i % 3 :] + names[: i % 3]
            rows.append({n: await send(client, targets[n], req, req.user.api_key) for n in order})
    out: dict[str, Any] = {"pairs": pairs}
    for side in SIDES:
        added = [1000 * (row[side] - row["direct"]) for row in rows]
        out[f"{side}_added_ms"] = {
            "p50": round(percentile(added, 50), 3),  # type: ignore[arg-type]
            "p90": round(percentile(added, 90), 3),
        }  # type: ignore[arg-type]
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.gateway_ab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--before", required=True, help="git ref of the gateway to compare with")
    p.add_argument("--adapters", type=int, default=16)
    p.add_argument("--requests", type=int, default=400, help="requests per round")
    p.add_argument("--rounds", type=int, default=9, help="rounds (each side once per round)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--pairs", type=int, default=300, help="serial latency triples")
    p.add_argument("--max-tokens", default="8,32", help="min,max completion tokens")
    p.add_argument("--var", type=Path, default=Path("var/bench-gateway-ab"))
    p.add_argument(
        "--out", type=Path, help="results path without suffix (default RESULT_DIR/gateway_ab)"
    )
    add_result_dir(p)
    args = p.parse_args(argv)
    args.out = args.out or result_path(args.result_dir, "gateway_ab")
    args.max_tokens = tuple(int(x) for x in args.max_tokens.split(","))
    return args


def table(result: dict[str, Any]) -> str:
    tp, lat = result["throughput"], result["latency"]
    lines = [
        "| gateway | req/s (fake upstream) | gateway CPU ms/req | added p50 / p90 ms |",
        "|---|---:|---:|---|",
    ]
    for side in SIDES:
        label = "now (this tree)" if side == "now" else f"before ({result['before']})"
        added = lat[f"{side}_added_ms"]
        lines.append(
            f"| {label} | {tp[f'{side}_rps']:.0f} | "
            f"{tp[f'{side}_cpu_ms_per_request']:.3f} | "
            f"{added['p50']:.2f} / {added['p90']:.2f} |"
        )
    lines.append(f"| direct (no gateway) | {tp['direct_rps']:.0f} | - | - |")
    lines.append("")
    lines.append(
        f"CPU per request, now / before (median of rounds): "
        f"**{tp['cpu_after_over_before']}x**; targets: <= {TARGET_FAKE_CPU_MS} ms "
        f"CPU and <= {TARGET_P50_MS} ms added p50"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from preft_serve.toymodels import make_model  # imports torch

    var = args.var.resolve()
    config = StackConfig(
        var=var,
        redis_port=free_port(),
        registry_port=free_port(),
        worker_port=free_port(),
        gateway_port=free_port(),
    )
    stack = OneBox(config)
    load_at_start = os.getloadavg()[0]

    def body() -> int:
        with tempfile.TemporaryDirectory() as tmp:
            model = make_model("tiny-llama", var / "model").resolve()
            adapters = make_adapters(model, var / "adapters", args.adapters)
            stack.start_redis()
            stack.start_registry(model)
            users = seed_tenants(stack, adapters, tenants=1, prefix="ab")
            fake_url = start_fake_upstream(stack).url
            ports = {side: free_port() for side in SIDES}
            before_path = import_dir(Path(tmp) / "before", args.before)
            gateways = {
                "now": stack.start_gateway(
                    model, [fake_url], port=ports["now"], name="gateway-now"
                ),
                "before": stack.start_gateway(
                    model,
                    [fake_url],
                    port=ports["before"],
                    name="gateway-before",
                    extra_env={"PYTHONPATH": str(before_path)},
                ),
            }
            targets = {"direct": direct_target(fake_url)}
            for side in SIDES:
                targets[side] = dataclass_replace_label(
                    gateway_target(f"http://127.0.0.1:{ports[side]}", config.base_model_name), side
                )
            reqs = request_mix(users, args.requests, args.max_tokens, seed=1)
            # Warm-up, untimed: every user and key cached in both gateways.
            asyncio.run(latency(targets, reqs[: 2 * len(users)], 2 * len(users)))
            print(
                f"throughput: {args.rounds} rounds x {args.requests} requests per side "
                f"at concurrency {args.concurrency}",
                flush=True,
            )
            tp = asyncio.run(
                throughput(
                    targets,
                    reqs,
                    args.rounds,
                    args.concurrency,
                    {s: g.pid for s, g in gateways.items()},
                )
            )
            print(f"latency: {args.pairs} requests, each direct, now and before", flush=True)
            lat = asyncio.run(latency(targets, reqs, args.pairs))
        result = {
            "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "before": args.before,
            "load_average_1m_at_start": round(load_at_start, 2),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
            "setup": {
                k: (list(v) if isinstance(v, tuple) else str(v))
                for k, v in vars(args).items()
                if k not in ("out", "var")
            },
            "throughput": tp,
            "latency": lat,
        }
        print(table(result))
        write_results(args.out, result, plot, table(result))
        return 0

    return stack_main(stack, body)


def plot(result: dict[str, Any], path: Path) -> None:
    """Each round's CPU per request of both gateways, and the added-latency percentiles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = result["throughput"]["rounds"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for side in SIDES:
        axes[0].plot(
            range(1, len(rounds) + 1), [r[f"{side}_cpu_ms"] for r in rounds], marker="o", label=side
        )
    axes[0].axhline(TARGET_FAKE_CPU_MS, color="red", ls="--", label="target")
    axes[0].set(xlabel="round", ylabel="gateway CPU ms / request", ylim=(0, None))
    axes[0].legend(fontsize=8)
    lat = result["latency"]
    for i, side in enumerate(SIDES):
        axes[1].bar(
            [i - 0.2, i + 0.2],
            [lat[f"{side}_added_ms"]["p50"], lat[f"{side}_added_ms"]["p90"]],
            width=0.35,
        )
    axes[1].set_xticks(range(len(SIDES)), [f"{s} (p50, p90)" for s in SIDES])
    axes[1].axhline(TARGET_P50_MS, color="red", ls="--")
    axes[1].set(ylabel="added latency ms")
    fig.suptitle(f"gateway now vs {result['before']}, fake upstream ({result['when']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def dataclass_replace_label(target: Target, label: str) -> Target:
    return Target(label, target.url, target.headers, target.body)


if __name__ == "__main__":
    raise SystemExit(main())
