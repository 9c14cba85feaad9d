"""Gateway overhead: the same requests straight to the worker and through the gateway.

One local stack (Redis, registry, one CPU worker, gateway; :mod:`preft_serve.onebox`),
one tenant with ``--adapters`` LoRA adapters (PreFT) and one bound user each. Every
request of the mix exists in two forms that make the worker do identical work: direct
(``model="sha256:<hex>"`` to the worker) and via the gateway (``user=...`` with the tenant
key; the gateway authenticates, resolves the binding, rewrites ``model`` and proxies).
Greedy decoding with ``ignore_eos`` fixes every answer's length; half the requests stream.

* **throughput**: the whole mix at ``--concurrency``, direct and gateway rounds
  alternating (which goes first alternates too) ``--rounds`` times; ratio = gateway req/s
  over direct req/s, per pair of rounds and overall.
* **added latency**: one request at a time, each request sent both ways back to back (order
  alternating); added = gateway latency - direct latency of the same request; p50/p90.
* the same on the same stack with the model's compute CPU isolated: vLLM binds its OpenMP
  thread to one CPU; every other thread (gateway, vLLM's API server and engine loop, this
  client, Redis, registry) is moved to the other CPUs, so nothing preempts the model step
  (on a 2-core machine the OS otherwise puts the gateway there, stalling the whole batch).
  In production the gateway runs in its own pods, so this is the closer picture.
* the same two measurements against ``bench/fake_worker.py``, an upstream that answers
  instantly, behind a second gateway: what the gateway itself costs, with no model work to
  hide it (its req/s there is the gateway's ceiling on this machine, not a ratio target).

Targets: with a real worker, >= 0.97x of direct throughput; against the instant upstream
(the gateway's own cost), <= 0.5 ms of gateway CPU per request and <= 1 ms added p50
latency.

    python -m bench.gateway_bench            # writes var/results/gateway_bench.*
    python -m bench.gateway_bench --quick    # fewer rounds: gateway_bench_quick.*
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import os
import platform
import random
import shlex
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.results import add_result_dir, result_path
from bench.stack_setup import (
    BoundUser,
    cpu_seconds,
    group_pids,
    isolate_model_cpus,
    make_adapters,
    release_cpus,
    seed_tenants,
    stack_main,
    start_fake_upstream,
    start_floor_proxy,
    write_results,
)
from bench.stats import percentile
from preft_serve.onebox import OneBox, StackConfig, free_port

# The targets in the docstring.
TARGET_RATIO, TARGET_P50_MS = 0.97, 1.0
TARGET_FAKE_CPU_MS = 0.5
ISOLATED = "vLLM worker, model CPU isolated"
WORDS = (
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
)


@dataclasses.dataclass(frozen=True)
class Req:
    user: BoundUser
    prompt: str
    max_tokens: int
    stream: bool


@dataclasses.dataclass(frozen=True)
class Target:
    """One way to send a request: a base URL, headers and a body builder."""

    label: str
    url: str
    headers: dict[str, str]
    body: Callable[[Req], dict[str, Any]]


def request_mix(
    users: list[BoundUser], count: int, max_tokens: tuple[int, int], seed: int = 0
) -> list[Req]:
    rng = random.Random(seed)
    return [
        Req(
            users[i % len(users)],
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24))),
            rng.randint(*max_tokens),
            stream=i % 2 == 1,
        )
        for i in range(count)
    ]


def _common(req: Req) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": req.prompt}],
        "max_tokens": req.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    if req.stream:
        # The gateway always asks the worker for usage; direct requests do too (same work).
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def direct_target(url: str) -> Target:
    return Target("direct", url, {}, lambda r: {**_common(r), "model": f"sha256:{r.user.sha256}"})


def gateway_target(url: str, base_model: str) -> Target:
    def body(r: Req) -> dict[str, Any]:
        return {**_common(r), "model": base_model, "user": r.user.user}

    return Target("gateway", url, {}, body)


async def send(client: httpx.AsyncClient, target: Target, req: Req, api_key: str) -> float:
    """Send ``req`` and read the whole answer; return its latency in seconds."""
    headers = {**target.headers, "Authorization": f"Bearer {api_key}"}
    body = target.body(req)
    start = time.perf_counter()
    if req.stream:
        async with client.stream(
            "POST", f"{target.url}/v1/chat/completions", json=body, headers=headers
        ) as resp:
            text = b"".join([chunk async for chunk in resp.aiter_bytes()])
        if resp.status_code != 200 or not text.rstrip().endswith(b"data: [DONE]"):
            raise RuntimeError(f"{target.label}: HTTP {resp.status_code} {text[:300]!r}")
    else:
        resp = await client.post(f"{target.url}/v1/chat/completions", json=body, headers=headers)
        if resp.status_code != 200:
            raise RuntimeError(f"{target.label}: HTTP {resp.status_code} {resp.text[:300]}")
        if resp.json()["usage"]["completion_tokens"] != req.max_tokens:
            raise RuntimeError(f"{target.label}: wrong token count {resp.text[:300]}")
    return time.perf_counter() - start


async def run_batch(
    client: httpx.AsyncClient,
    target: Target,
    reqs: list[Req],
    concurrency: int,
    cpu: dict[str, list[int]],
) -> dict[str, float]:
    """Send all ``reqs`` with ``concurrency`` in flight; return requests per second and the
    CPU milliseconds per request each process group in ``cpu`` spent meanwhile."""
    queue = list(reversed(reqs))

    async def lane() -> None:
        while queue:
            req = queue.pop()
            await send(client, target, req, req.user.api_key)

    before = {k: cpu_seconds(pids) for k, pids in cpu.items()}
    start = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    out = {"rps": len(reqs) / (time.perf_counter() - start)}
    for k, pids in cpu.items():
        out[f"{k}_cpu_ms"] = 1000 * (cpu_seconds(pids) - before[k]) / len(reqs)
    return out


async def throughput(
    direct: Target,
    gateway: Target,
    reqs: list[Req],
    rounds: int,
    concurrency: int,
    cpu: dict[str, list[int]],
    floor: Target | None = None,
) -> dict[str, Any]:
    """Alternating rounds of direct and gateway; with ``floor`` (the minimal proxy, its
    processes under ``cpu["floor"]``) a third side in the same rotation, so the gateway's
    CPU can be read against the floor's round by round (the machine's speed drifts by
    ~1.5x between minutes: a floor measured after the gateway is not comparable)."""
    limits = httpx.Limits(
        max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2
    )
    per_round = []
    sides = [direct, gateway] + ([floor] if floor is not None else [])
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        for r in range(rounds):
            first = r % len(sides)
            order = sides[first:] + sides[:first]
            got = {t.label: await run_batch(client, t, reqs, concurrency, cpu) for t in order}
            row: dict[str, Any] = {"first": order[0].label}
            for label, m in got.items():
                row |= {f"{label}_{k}": round(v, 2) for k, v in m.items()}
            row["ratio"] = round(got["gateway"]["rps"] / got["direct"]["rps"], 4)
            floor_note = ""
            if floor is not None:
                row["gateway_to_floor_cpu"] = round(
                    row["gateway_gateway_cpu_ms"] / row["floor_floor_cpu_ms"], 4
                )
                floor_note = (
                    f", floor {row['floor_floor_cpu_ms']:.2f} ms/req "
                    f"({row['gateway_to_floor_cpu']:.2f}x)"
                )
            per_round.append(row)
            print(
                f"    round {r + 1}/{rounds}: direct {row['direct_rps']:.1f} req/s, gateway "
                f"{row['gateway_rps']:.1f} req/s ({row['ratio']:.3f}x); gateway CPU "
                f"{row['gateway_gateway_cpu_ms']:.2f} ms/req{floor_note}",
                flush=True,
            )
    # Overall: all requests of one side over all of that side's time.
    total = {
        k: len(reqs) * rounds / sum(len(reqs) / row[f"{k}_rps"] for row in per_round)
        for k in ("direct", "gateway")
    }
    med = statistics.median
    gateway_cpu = med(row["gateway_gateway_cpu_ms"] for row in per_round)
    upstream_cpu = med(row["direct_upstream_cpu_ms"] for row in per_round)
    same_rounds = {}
    if floor is not None:
        ratios = [row["gateway_to_floor_cpu"] for row in per_round]
        same_rounds = {
            "floor_cpu_ms_per_request": round(med(r["floor_floor_cpu_ms"] for r in per_round), 3),
            "gateway_to_floor_cpu_median_of_rounds": round(med(ratios), 4),
            "gateway_to_floor_cpu_min_max": [min(ratios), max(ratios)],
        }
    return {
        "requests_per_round": len(reqs),
        "concurrency": concurrency,
        "rounds": per_round,
        **same_rounds,
        "direct_rps": round(total["direct"], 2),
        "gateway_rps": round(total["gateway"], 2),
        "ratio": round(total["gateway"] / total["direct"], 4),
        "ratio_median_of_rounds": round(med(row["ratio"] for row in per_round), 4),
        "ratio_min_max": [
            min(row["ratio"] for row in per_round),
            max(row["ratio"] for row in per_round),
        ],
        "gateway_cpu_ms_per_request": round(gateway_cpu, 3),
        "upstream_cpu_ms_per_request": round(upstream_cpu, 3),
        # If every CPU second were interchangeable and the box CPU-bound:
        "cpu_bound_ratio_estimate": round(upstream_cpu / (upstream_cpu + gateway_cpu), 4),
    }


async def added_latency(
    direct: Target, gateway: Target, reqs: list[Req], pairs: int
) -> dict[str, Any]:
    """One request at a time, each sent both ways back to back; percentiles of the
    per-request difference, overall and for streamed / whole answers separately."""
    rows = []
    async with httpx.AsyncClient(timeout=300) as client:
        for i in range(pairs):
            req = reqs[i % len(reqs)]
            order = (direct, gateway) if i % 2 == 0 else (gateway, direct)
            got = {t.label: await send(client, t, req, req.user.api_key) for t in order}
            rows.append((req.stream, got["direct"], got["gateway"]))

    def ms(xs: list[float], q: int) -> float:
        return round(percentile(xs, q) * 1000, 3)  # type: ignore[operator]

    diffs = [g - d for _, d, g in rows]
    by_kind = {
        kind: [g - d for s, d, g in rows if s == streamed]
        for kind, streamed in (("stream", True), ("non_stream", False))
    }
    return {
        "pairs": pairs,
        "added_ms": {
            "p50": ms(diffs, 50),
            "p90": ms(diffs, 90),
            "mean": round(statistics.fmean(diffs) * 1000, 3),
        },
        "added_ms_by_kind": {k: {"p50": ms(v, 50), "p90": ms(v, 90)} for k, v in by_kind.items()},
        "direct_ms": {
            "p50": ms([d for _, d, _ in rows], 50),
            "p90": ms([d for _, d, _ in rows], 90),
        },
        "gateway_ms": {
            "p50": ms([g for _, _, g in rows], 50),
            "p90": ms([g for _, _, g in rows], 90),
        },
        "_diffs_ms": [round(d * 1000, 3) for d in diffs],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.gateway_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--adapters", type=int, default=16)
    p.add_argument("--requests", type=int, default=96, help="requests per throughput round")
    p.add_argument("--rounds", type=int, default=8, help="throughput rounds per side")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--pairs", type=int, default=200, help="serial latency pairs")
    p.add_argument("--max-tokens", default="8,32", help="min,max completion tokens")
    p.add_argument(
        "--fake-requests",
        type=int,
        default=400,
        help="requests per throughput round against the fake upstream",
    )
    p.add_argument("--fake-pairs", type=int, default=400)
    p.add_argument("--no-fake", action="store_true", help="skip the fake-upstream part")
    p.add_argument(
        "--fake-only",
        action="store_true",
        help="only the fake-upstream part: the gateway's own cost, no vLLM worker "
        "(quick to repeat while optimising the gateway)",
    )
    p.add_argument(
        "--no-isolate",
        action="store_true",
        help="skip the second vLLM part (model CPU left to the model alone)",
    )
    p.add_argument("--var", type=Path, default=Path("var/bench-gateway"))
    p.add_argument("--worker-args", default="--max-num-seqs 64")
    p.add_argument("--quick", action="store_true", help="2 rounds, 40 pairs")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results path without suffix (default RESULT_DIR/gateway_bench[_quick|_fake])",
    )
    add_result_dir(p)
    args = p.parse_args(argv)
    name = "gateway_bench_fake" if args.fake_only else "gateway_bench"
    if args.quick:
        args.rounds, args.pairs, args.fake_pairs, args.fake_requests = 2, 40, 100, 200
        name = "gateway_bench_quick"
    args.out = args.out or result_path(args.result_dir, name)
    args.max_tokens = tuple(int(x) for x in args.max_tokens.split(","))
    return args


def table(results: dict[str, Any]) -> str:
    rows = [
        (
            "upstream",
            "direct req/s",
            "gateway req/s",
            "ratio (median, min-max)",
            "direct p50 ms",
            "gateway p50 ms",
            "added p50 ms",
            "added p90 ms",
            "gateway CPU ms/req",
            "upstream CPU ms/req",
        )
    ]
    for name, part in results["parts"].items():
        t, lat = part["throughput"], part["latency"]
        lo, hi = t["ratio_min_max"]
        rows.append(
            (
                name,
                f"{t['direct_rps']:.1f}",
                f"{t['gateway_rps']:.1f}",
                f"{t['ratio']:.3f}x ({t['ratio_median_of_rounds']:.3f}, {lo:.2f}-{hi:.2f})",
                f"{lat['direct_ms']['p50']:.2f}",
                f"{lat['gateway_ms']['p50']:.2f}",
                f"{lat['added_ms']['p50']:.2f}",
                f"{lat['added_ms']['p90']:.2f}",
                f"{t['gateway_cpu_ms_per_request']:.2f}",
                f"{t['upstream_cpu_ms_per_request']:.2f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = results["parts"]
    fig, axes = plt.subplots(1, 1 + len(parts), figsize=(5.5 * (1 + len(parts)), 4.5))
    for (name, part), color in zip(parts.items(), ("tab:blue", "tab:green")):
        if name == "fake upstream":
            continue
        rounds = part["throughput"]["rounds"]
        xs = range(1, len(rounds) + 1)
        ratio = part["throughput"]["ratio"]
        axes[0].plot(
            xs, [r["direct_rps"] for r in rounds], "o-", color=color, label=f"{name}: direct"
        )
        axes[0].plot(
            xs,
            [r["gateway_rps"] for r in rounds],
            "s--",
            color=color,
            label=f"{name}: gateway ({ratio:.2f}x)",
        )
    axes[0].set(
        xlabel="round", ylabel="req/s", title="throughput, alternating rounds", ylim=(0, None)
    )
    axes[0].legend(fontsize=7)
    for ax, (name, part) in zip(axes[1:], parts.items()):
        diffs = sorted(part["latency"]["_diffs_ms"])
        ax.plot(diffs, [(i + 1) / len(diffs) for i in range(len(diffs))])
        ax.axvline(TARGET_P50_MS, color="red", ls="--", label=f"{TARGET_P50_MS} ms target")
        ax.axhline(0.5, color="grey", lw=0.5)
        ax.set(
            xlabel="gateway - direct, same request (ms)",
            ylabel="fraction",
            title=f"added latency, {name}\n(p50 {part['latency']['added_ms']['p50']:.2f} ms)",
        )
        lo, hi = percentile(diffs, 2), percentile(diffs, 95)
        ax.set_xlim(min(lo, 0) - 1, max(hi, TARGET_P50_MS) + 1)  # type: ignore[type-var,operator]
        ax.legend(fontsize=7)
    fig.suptitle(f"gateway overhead ({results['machine']}, {results['when']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def measure(
    direct: Target,
    gateway: Target,
    reqs: list[Req],
    rounds: int,
    concurrency: int,
    pairs: int,
    cpu: dict[str, list[int]],
    floor: Target | None = None,
) -> dict[str, Any]:
    # Warm-up: every adapter loaded in the worker, every user and key cached in the gateway.
    async with httpx.AsyncClient(timeout=300) as client:
        for req in reqs[: 2 * len({r.user.user for r in reqs})]:
            for target in (direct, gateway, *([floor] if floor else [])):
                await send(client, target, req, req.user.api_key)
    print("  throughput rounds", flush=True)
    tp = await throughput(direct, gateway, reqs, rounds, concurrency, cpu, floor)
    print("  serial latency pairs", flush=True)
    lat = await added_latency(direct, gateway, reqs, pairs)
    kinds = lat["added_ms_by_kind"]
    print(
        f"    added p50 {lat['added_ms']['p50']:.2f} ms, p90 {lat['added_ms']['p90']:.2f} ms "
        f"(p50 streamed {kinds['stream']['p50']:.2f}, whole {kinds['non_stream']['p50']:.2f})",
        flush=True,
    )
    return {"throughput": tp, "latency": lat}


def _real_worker_parts(
    args: argparse.Namespace,
    stack: OneBox,
    config: StackConfig,
    model: Path,
    worker: Any,
    users: list[BoundUser],
    results: dict[str, Any],
) -> None:
    """Parts 1 and 2: the vLLM worker direct vs through the gateway, then the same with
    the model's CPU isolated."""
    stack.wait_worker()
    gateway = stack.start_gateway(model)
    reqs = request_mix(users, args.requests, args.max_tokens)
    print(
        f"[1/3] vLLM worker: {args.adapters} adapters, {args.requests} requests x "
        f"{args.rounds} rounds per side at concurrency {args.concurrency}",
        flush=True,
    )
    results["parts"]["vLLM worker"] = asyncio.run(
        measure(
            direct_target(stack.worker_url),
            gateway_target(stack.gateway_url, config.base_model_name),
            reqs,
            args.rounds,
            args.concurrency,
            args.pairs,
            {"gateway": [gateway.pid], "upstream": group_pids(worker.pid)},
        )
    )
    if args.no_isolate:
        return
    model_cpus, moved = isolate_model_cpus(
        [pid for c in stack.children for pid in group_pids(c.pid)]
    )
    if moved:
        print(
            f"[2/3] vLLM worker again, its compute CPU(s) {sorted(model_cpus)} "
            "left to it alone (everything else moved to the other CPUs)",
            flush=True,
        )
        try:
            results["parts"][ISOLATED] = asyncio.run(
                measure(
                    direct_target(stack.worker_url),
                    gateway_target(stack.gateway_url, config.base_model_name),
                    reqs,
                    args.rounds,
                    args.concurrency,
                    args.pairs,
                    {"gateway": [gateway.pid], "upstream": group_pids(worker.pid)},
                )
            )
        finally:
            release_cpus(moved)
    else:
        print("[2/3] skipped: vLLM bound no CPU of its own", flush=True)


FLOOR = "fake upstream, minimal proxy (floor)"


def verdict(parts: dict[str, Any]) -> dict[str, dict[str, bool]]:
    """Each target, met or not: throughput against real workers; the gateway's own CPU and
    added latency against the instant upstream (with a model behind it, the added latency
    is mostly waiting for a CPU the model holds, see docs/benchmarks.md)."""
    out = {}
    for name, part in parts.items():
        if name == FLOOR:
            continue  # a reference, not the gateway
        if name == "fake upstream":
            out[name] = {
                "gateway_cpu_met": part["throughput"]["gateway_cpu_ms_per_request"]
                <= TARGET_FAKE_CPU_MS,
                "added_p50_met": part["latency"]["added_ms"]["p50"] <= TARGET_P50_MS,
            }
        else:
            out[name] = {"throughput_ratio_met": part["throughput"]["ratio"] >= TARGET_RATIO}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_at_start = os.getloadavg()[0]
    from preft_serve.toymodels import make_model  # imports torch

    var = args.var.resolve()
    config = StackConfig(
        var=var,
        redis_port=free_port(),
        registry_port=free_port(),
        worker_port=free_port(),
        gateway_port=free_port(),
        worker_args=shlex.split(args.worker_args),
    )
    stack = OneBox(config)

    def body() -> int:
        model = make_model("tiny-llama", var / "model").resolve()
        adapters = make_adapters(model, var / "adapters", args.adapters)
        worker = None if args.fake_only else stack.start_worker(model)
        stack.start_redis()
        stack.start_registry(model)
        users = seed_tenants(stack, adapters, tenants=1, prefix="bench")
        results: dict[str, Any] = {
            "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            # Other processes on the machine skew every number; this says how busy it was.
            "load_average_1m_at_start": round(load_at_start, 2),
            "setup": {k: v for k, v in vars(args).items() if k not in ("out", "var")},
            "targets": {
                "throughput_ratio": TARGET_RATIO,
                "added_p50_ms": TARGET_P50_MS,
                "fake_upstream_gateway_cpu_ms": TARGET_FAKE_CPU_MS,
            },
            "parts": {},
        }
        if worker is not None:
            _real_worker_parts(args, stack, config, model, worker, users, results)
        if args.fake_only or not args.no_fake:
            print("[3/3] fake upstream (answers instantly) behind a second gateway", flush=True)
            fake_gw_port = free_port()
            fake = start_fake_upstream(stack)
            fake_url = fake.url
            fake_gateway = stack.start_gateway(
                model, [fake_url], port=fake_gw_port, name="gateway-fake"
            )
            fake_reqs = request_mix(users, args.fake_requests, args.max_tokens, seed=1)
            floor = start_floor_proxy(stack, fake_url)
            print(
                "    (the minimal proxy, bench/floor_proxy.py, takes a third turn in "
                "the same rounds: the CPU floor of any Python proxy here)",
                flush=True,
            )
            results["parts"]["fake upstream"] = asyncio.run(
                measure(
                    direct_target(fake_url),
                    gateway_target(f"http://127.0.0.1:{fake_gw_port}", config.base_model_name),
                    fake_reqs,
                    args.rounds,
                    args.concurrency,
                    args.fake_pairs,
                    {"gateway": [fake_gateway.pid], "upstream": [fake.pid], "floor": [floor.pid]},
                    floor=dataclasses.replace(direct_target(floor.url), label="floor"),
                )
            )
            print("[+] the minimal proxy's own latency pairs and ratio to direct", flush=True)
            results["parts"][FLOOR] = asyncio.run(
                measure(
                    direct_target(fake_url),
                    dataclasses.replace(direct_target(floor.url), label="gateway"),
                    fake_reqs,
                    args.rounds,
                    args.concurrency,
                    args.fake_pairs,
                    {"gateway": [floor.pid], "upstream": [fake.pid]},
                )
            )
        results["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
        print(table(results))
        if (fake_part := results["parts"].get("fake upstream")) is not None:
            t = fake_part["throughput"]
            lo, hi = t["gateway_to_floor_cpu_min_max"]
            print(
                f"gateway CPU / minimal proxy CPU, same rounds: "
                f"{t['gateway_to_floor_cpu_median_of_rounds']:.2f}x (median of rounds, "
                f"{lo:.2f}-{hi:.2f}); floor {t['floor_cpu_ms_per_request']:.2f} ms/req"
            )
        results["verdict"] = verdict(results["parts"])
        print(json.dumps(results["verdict"]))
        write_results(args.out, results, plot)
        return 0

    return stack_main(stack, body)


if __name__ == "__main__":
    raise SystemExit(main())
