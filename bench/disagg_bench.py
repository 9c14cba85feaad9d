"""Two pools vs one: latency of PreFT requests prefilled on an adapter worker and decoded on
an adapter-free worker, against the same requests served whole by the adapter worker.

One local stack (:mod:`preft_serve.onebox`): Redis, the registry, a worker started with
``--role prefill`` (adapters), a worker with ``--role decode`` (base model only), and two
gateways in front of the same prefill worker: one without a decode pool (**unified**: the
prefill worker serves the whole request, as a deployment without a decode pool does) and
one with it (**pools**: prefill hop, NIXL KV transfer, decode hop). ``--adapters`` PreFT
LoRA adapters, one bound user each.

For each prompt length, ``--rounds`` requests of that length (random token ids, greedy,
``ignore_eos``, ``--output`` tokens, streamed) go to both gateways one at a time, back to
back, the order alternating; each request has its own ``cache_salt``, so neither hop
reuses another's prompt KV. The first pair of each length is warm-up and not counted.
Both answers must have the same tokens, or part where greedy decoding meets a near tie (the
unified worker's top two log-probabilities at that step within :data:`TIE_LOGPROB`, asked
again with logprobs; recorded per row as ``near_ties``): a toy model's random weights make
near-flat distributions, and the two paths' kernels differ in float32 rounding. Any other
difference fails the run.

Measured, side by side: time to first token (first text event) and to the last byte,
p50 of each and the pools/unified ratio; the KV transfer per request, read from the decode
worker's NIXL metrics (``vllm:nixl_xfer_time_seconds``, ``vllm:nixl_bytes_transferred``),
per 1k prompt tokens; the gateway's handoff time (prefill answer to decode worker's first
byte: transfer plus queue). Each worker's model threads get a CPU of their own
(``VLLM_CPU_OMP_THREADS_BIND``), as on two machines; unified serving uses the prefill worker's
CPU alone. One request at a time, the pools cannot show their throughput benefit (decode
batches without adapter work); what this run measures is what the split costs one request.

    python -m bench.disagg_bench            # writes var/results/disagg_bench.*
    python -m bench.disagg_bench --quick    # 2 lengths, 4 rounds: disagg_bench_quick.*
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.results import add_result_dir, result_path
from bench.stack_setup import (
    BoundUser,
    make_adapters,
    scrape,
    seed_tenants,
    stack_main,
    write_results,
)
from bench.stats import median
from preft_serve.onebox import OneBox, StackConfig, free_port

MODES = ("unified", "pools")
NIXL_METRICS = (
    "vllm:nixl_xfer_time_seconds_sum",
    "vllm:nixl_xfer_time_seconds_count",
    "vllm:nixl_bytes_transferred_sum",
)
HANDOFF_METRICS = (
    "preft_gateway_handoff_seconds_sum",
    "preft_gateway_handoff_seconds_count",
    "preft_gateway_handoffs_total",
)


def core_of(index: int) -> dict[str, str]:
    """Each worker's model threads on a CPU of their own (as on two machines), when there
    are two: otherwise both workers' OpenMP threads share every core and each one's steps
    stall the other's."""
    cpus = sorted(os.sched_getaffinity(0))
    return {"VLLM_CPU_OMP_THREADS_BIND": str(cpus[index])} if len(cpus) >= 2 else {}


def two_pool_stack(
    var: Path, max_model_len: int, *more_ports: str
) -> tuple[OneBox, dict[str, int]]:
    """A local stack whose worker is a prefill worker (on CPU 0), and free ports for it, a
    decode worker (``decode``, ``kv_decode``) and ``more_ports``."""
    ports = {
        name: free_port()
        for name in (
            "redis",
            "registry",
            "worker",
            "gateway",
            "decode",
            "kv_prefill",
            "kv_decode",
            *more_ports,
        )
    }
    stack = OneBox(
        StackConfig(
            var=var,
            redis_port=ports["redis"],
            registry_port=ports["registry"],
            worker_port=ports["worker"],
            gateway_port=ports["gateway"],
            max_model_len=max_model_len,
            kv_cache_gib=0.5,
            worker_args=["--role", "prefill", "--kv-port", str(ports["kv_prefill"])],
            worker_env=core_of(0),
        )
    )
    return stack, ports


def start_two_pools(stack: OneBox, model: Path, ports: dict[str, int]) -> str:
    """Redis, the registry, the prefill worker and a decode worker (on CPU 1), each ready;
    the decode worker's URL."""
    stack.start_redis()
    stack.start_registry(model)
    stack.start_worker(model)
    decode = stack.start(
        "decode",
        [
            sys.executable,
            "-m",
            "preft_serve.worker.serve",
            "--model",
            str(model),
            "--port",
            str(ports["decode"]),
            "--role",
            "decode",
            "--kv-port",
            str(ports["kv_decode"]),
            "--kv-cache-gib",
            "0.5",
            "--max-model-len",
            str(stack.config.max_model_len),
        ],
        core_of(1),
    )
    stack.wait_worker()
    url = f"http://127.0.0.1:{ports['decode']}"
    decode.wait_ready(
        lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200,
        stack.config.worker_timeout_s,
        0.5,
    )
    return url


def timed_stream(
    url: str, user: BoundUser, prompt: list[int], output: int, salt: str
) -> tuple[float, float, list[int]]:
    """One streamed completion: (seconds to the first text, to the end, token ids)."""
    body = {
        "prompt": prompt,
        "max_tokens": output,
        "temperature": 0,
        "ignore_eos": True,
        "user": user.user,
        "stream": True,
        "return_token_ids": True,
        "cache_salt": salt,
    }
    headers = {"Authorization": f"Bearer {user.api_key}"}
    ids: list[int] = []
    first = 0.0
    start = time.perf_counter()
    with httpx.stream(
        "POST", f"{url}/v1/completions", json=body, headers=headers, timeout=300
    ) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {reply.status_code} {reply.read()[:300]!r}")
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"{url}: {event['error']}")
            for choice in event.get("choices") or []:
                ids += choice.get("token_ids") or []
                if not first and choice.get("text"):
                    first = time.perf_counter() - start
    return first, time.perf_counter() - start, ids


TIE_LOGPROB = 1e-4
"""Two answers may part where the greedy choice is a near tie: the unified worker's top two
log-probabilities within this (float32 noise between the two paths' kernels measures about
1e-6; KV that arrived wrong or stale moves them by orders of magnitude more)."""


def near_tie(
    url: str, user: BoundUser, prompt: list[int], unified: list[int], pools: list[int]
) -> dict[str, Any]:
    """Where the two answers part, and how close the unified worker's top two choices were
    there (asked again with logprobs, which the gateway serves whole). A real divergence,
    not a near tie, fails the run."""
    step = next(i for i, (a, b) in enumerate(zip(unified, pools, strict=True)) if a != b)
    body = {
        "prompt": prompt,
        "max_tokens": step + 1,
        "temperature": 0,
        "ignore_eos": True,
        "user": user.user,
        "logprobs": 2,
        "return_token_ids": True,
    }
    reply = httpx.post(
        f"{url}/v1/completions",
        json=body,
        timeout=300,
        headers={"Authorization": f"Bearer {user.api_key}"},
    )
    reply.raise_for_status()
    choice = reply.json()["choices"][0]
    top = sorted(choice["logprobs"]["top_logprobs"][step].values(), reverse=True)
    gap = top[0] - top[1] if len(top) > 1 else float("inf")
    if choice["token_ids"] != unified[: step + 1]:
        raise RuntimeError(
            f"prompt of {len(prompt)} tokens: asked again, the unified worker "
            f"answered {choice['token_ids']}, before {unified[: step + 1]}"
        )
    if gap > TIE_LOGPROB:
        raise RuntimeError(
            f"prompt of {len(prompt)} tokens: the pools answered {pools}, the "
            f"unified worker {unified}; at step {step} the top two "
            f"log-probabilities differ by {gap:.3g} (more than a near tie)"
        )
    return {"prompt_tokens": len(prompt), "step": step, "top2_gap": gap}


def delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith(name + "{"))


def measure_length(
    urls: dict[str, str],
    decode_url: str,
    users: list[BoundUser],
    length: int,
    rounds: int,
    output: int,
    rng: random.Random,
) -> dict[str, Any]:
    """``rounds`` pairs of one prompt length (the first is warm-up); a row of the table."""
    samples: dict[str, dict[str, list[float]]] = {m: {"ttft": [], "e2e": []} for m in MODES}
    nixl_before, handoff_before = {}, {}
    ties: list[dict[str, Any]] = []
    for index in range(rounds):
        user = users[index % len(users)]
        prompt = [rng.randrange(3, 250) for _ in range(length)]
        if index == 1:  # after the warm-up pair
            nixl_before = scrape(decode_url, NIXL_METRICS)
            handoff_before = scrape(urls["pools"], HANDOFF_METRICS)
        order = MODES if index % 2 == 0 else MODES[::-1]
        tokens = {}
        for mode in order:
            ttft, e2e, tokens[mode] = timed_stream(
                urls[mode], user, prompt, output, uuid.uuid4().hex
            )
            if index:
                samples[mode]["ttft"].append(ttft)
                samples[mode]["e2e"].append(e2e)
        if len(tokens["pools"]) != output:
            raise RuntimeError(
                f"prompt of {length} tokens: the pools answered "
                f"{len(tokens['pools'])} of {output} tokens"
            )
        if tokens["unified"] != tokens["pools"]:
            ties.append(near_tie(urls["unified"], user, prompt, tokens["unified"], tokens["pools"]))
    nixl_after = scrape(decode_url, NIXL_METRICS)
    handoff_after = scrape(urls["pools"], HANDOFF_METRICS)
    measured = rounds - 1
    transfers = delta(nixl_after, nixl_before, "vllm:nixl_xfer_time_seconds_count")
    xfer_s = delta(nixl_after, nixl_before, "vllm:nixl_xfer_time_seconds_sum")
    xfer_bytes = delta(nixl_after, nixl_before, "vllm:nixl_bytes_transferred_sum")
    handoff_s = delta(handoff_after, handoff_before, "preft_gateway_handoff_seconds_sum")
    row: dict[str, Any] = {
        "prompt_tokens": length,
        "requests": measured,
        "transfers": transfers,
        "near_ties": ties,
    }
    for mode in MODES:
        row[f"{mode}_ttft_ms"] = 1000 * median(samples[mode]["ttft"])
        row[f"{mode}_e2e_ms"] = 1000 * median(samples[mode]["e2e"])
        # Every sample, so a reader sees the spread behind each median.
        row[f"{mode}_samples_ms"] = {
            k: [round(1000 * v, 1) for v in vs] for k, vs in samples[mode].items()
        }
    row["ttft_ratio"] = row["pools_ttft_ms"] / row["unified_ttft_ms"]
    row["e2e_ratio"] = row["pools_e2e_ms"] / row["unified_e2e_ms"]
    per_request = max(transfers, 1)
    row["transfer_ms"] = 1000 * xfer_s / per_request
    row["transfer_mb"] = xfer_bytes / per_request / 1e6
    row["transfer_ms_per_1k_tokens"] = row["transfer_ms"] * 1000 / length
    row["transfer_mb_per_1k_tokens"] = row["transfer_mb"] * 1000 / length
    row["handoff_ms"] = 1000 * handoff_s / measured
    return row


TABLE_HEAD = (
    "| prompt tokens | TTFT unified ms | TTFT pools ms | TTFT ratio | e2e unified ms "
    "| e2e pools ms | e2e ratio | transfer ms | transfer ms / 1k tok | MB / 1k tok "
    "| handoff ms |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [TABLE_HEAD]
    for r in rows:
        lines.append(
            f"| {r['prompt_tokens']} | {r['unified_ttft_ms']:.1f} | {r['pools_ttft_ms']:.1f} "
            f"| {r['ttft_ratio']:.2f}x | {r['unified_e2e_ms']:.1f} | {r['pools_e2e_ms']:.1f} "
            f"| {r['e2e_ratio']:.2f}x | {r['transfer_ms']:.2f} "
            f"| {r['transfer_ms_per_1k_tokens']:.2f} | {r['transfer_mb_per_1k_tokens']:.2f} "
            f"| {r['handoff_ms']:.1f} |"
        )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    lengths = [str(r["prompt_tokens"]) for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, metric, title in (
        (axes[0], "ttft", "time to first token (ms, p50)"),
        (axes[1], "e2e", "end to end (ms, p50)"),
    ):
        width = 0.38
        for i, mode in enumerate(MODES):
            ax.bar(
                [x + (i - 0.5) * width for x in range(len(rows))],
                [r[f"{mode}_{metric}_ms"] for r in rows],
                width,
                label=mode,
            )
        ax.set_xticks(range(len(rows)), lengths)
        ax.set_xlabel("prompt tokens")
        ax.set_title(title)
        ax.legend()
    axes[2].plot(lengths, [r["transfer_ms"] for r in rows], marker="o", label="NIXL transfer")
    axes[2].plot(
        lengths, [r["handoff_ms"] for r in rows], marker="s", label="handoff (transfer + queue)"
    )
    axes[2].set_xlabel("prompt tokens")
    axes[2].set_title("per request (ms)")
    axes[2].legend()
    fig.suptitle(
        f"Two pools vs one worker, {result['config']['model']} on "
        f"{result['machine']['cpus']} CPUs (both workers share them)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.disagg_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        default="bench-llama",
        help="a toy preset (default bench-llama) or a model directory",
    )
    p.add_argument(
        "--lengths",
        default="128,512,2048",
        help="prompt lengths in tokens, comma-separated (default %(default)s)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=9,
        help="requests per length and mode, the first one warm-up (default 9)",
    )
    p.add_argument("--output", type=int, default=32, help="output tokens per request")
    p.add_argument("--adapters", type=int, default=4, help="PreFT adapters (bound users)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="lengths 64,256, 4 rounds, 16 output tokens; writes disagg_bench_quick",
    )
    p.add_argument("--var", type=Path, default=Path("var/bench/disagg"))
    p.add_argument(
        "--out",
        type=Path,
        help="results path without suffix (default RESULT_DIR/disagg_bench[_quick])",
    )
    add_result_dir(p)
    args = p.parse_args(argv)
    if args.quick:
        args.lengths, args.rounds, args.output = "64,256", 4, 16
    args.var = args.var.resolve()  # the stack's parts run in their own directories
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.rounds < 2:
        p.error("--rounds must be at least 2 (the first is warm-up)")
    out = args.out or result_path(
        args.result_dir, "disagg_bench_quick" if args.quick else "disagg_bench"
    )

    from preft_serve.toymodels import PRESETS, make_model

    model = (
        make_model(args.model, args.var / args.model) if args.model in PRESETS else Path(args.model)
    )
    stack, ports = two_pool_stack(args.var, max(lengths) + args.output + 64, "pools")

    def body() -> int:
        print("[1/4] Redis, registry, prefill and decode workers", flush=True)
        decode_url = start_two_pools(stack, model, ports)
        print("[2/4] two gateways: without and with the decode pool", flush=True)
        stack.start_gateway(model)
        stack.start_gateway(
            model,
            port=ports["pools"],
            name="gateway-pools",
            extra_env={"PREFT_GATEWAY_DECODE_WORKER_URLS": decode_url},
        )
        print(f"[3/4] {args.adapters} PreFT adapters", flush=True)
        adapters = make_adapters(model, args.var / "adapters", args.adapters)
        users = seed_tenants(stack, adapters, tenants=1, prefix="disagg")
        urls = {"unified": stack.gateway_url, "pools": f"http://127.0.0.1:{ports['pools']}"}
        rng = random.Random(0)
        rows = []
        for length in lengths:
            print(f"[4/4] prompts of {length} tokens: {args.rounds} pairs", flush=True)
            rows.append(
                measure_length(urls, decode_url, users, length, args.rounds, args.output, rng)
            )
        result = {
            "what": "PreFT requests one at a time, streamed: unified (one worker) vs pools "
            "(prefill worker + NIXL + decode worker); p50 of the measured rounds",
            "command": "python -m bench.disagg_bench " + " ".join(argv or sys.argv[1:]),
            "config": {
                "model": args.model,
                "lengths": lengths,
                "rounds": args.rounds,
                "warmup_rounds": 1,
                "output_tokens": args.output,
                "adapters": args.adapters,
            },
            "machine": {"cpus": len(os.sched_getaffinity(0)), "platform": platform.platform()},
            "rows": rows,
        }
        markdown = table(rows)
        print(markdown)
        write_results(out, result, plot, markdown)
        return 0

    return stack_main(stack, body)


if __name__ == "__main__":
    raise SystemExit(main())
