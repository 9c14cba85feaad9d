"""Load test: locust users through the gateway, spread over thousands of bound adapters.

Brings up a local stack (:mod:`preft_serve.localstack`: Redis, registry, one CPU worker,
gateway) under ``--var``, creates ``--adapters`` rank-4 LoRA adapters with distinct seeds
(so distinct hashes), uploads them over the registry's REST API to ``--tenants`` tenants
and binds one user per adapter, then runs locust headless (``loadtests/locustfile.py``):
``--users`` concurrent clients, each sending chat completions back to back for random
users, ``--stream-fraction`` of them streamed. Writes ``<out>_summary.json`` (throughput
in requests/s and completion tokens/s, TTFT and latency percentiles, errors by type,
worker adapter loads, gateway routing), ``<out>_summary.png`` and locust's CSVs.

    python -m loadtests.loadtest --adapters 2000 --users 50 --duration 60s
    python -m loadtests.loadtest --quick          # 200 adapters, 10 users, 20 s
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from preft_serve.localstack import LocalStack, StackConfig, StackError, free_port

from loadtests.stack_setup import make_adapters, percentile, scrape, seed_tenants

RESULTS = Path(__file__).parent / "results"
LOCUSTFILE = Path(__file__).with_name("locustfile.py")
WORKER_METRICS = ("preft_worker_adapter_loads_total", "preft_worker_adapter_evictions_total")
GATEWAY_METRICS = ("preft_gateway_routing_total", "preft_gateway_errors_total")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtests.loadtest", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--adapters", type=int, default=2000)
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument("--all-fraction", type=float, default=0.0,
                   help="share of adapters uploaded in mode 'all' (rest: prefill)")
    p.add_argument("--users", type=int, default=50, help="concurrent locust users")
    p.add_argument("--spawn-rate", type=float, default=10)
    p.add_argument("--duration", default="60s", help="locust --run-time (e.g. 60s, 5m)")
    p.add_argument("--stream-fraction", type=float, default=0.5)
    p.add_argument("--max-tokens", default="8,32", help="min,max completion tokens")
    p.add_argument("--prompt-words", default="4,40", help="min,max prompt words")
    p.add_argument("--var", type=Path, default=Path("var/loadtest"))
    p.add_argument("--worker-args", default="--max-num-seqs 64",
                   help="extra worker/vLLM flags, one shell-quoted string")
    p.add_argument("--out", default=str(RESULTS / "locust"),
                   help="output prefix (default loadtests/results/locust)")
    p.add_argument("--quick", action="store_true",
                   help="200 adapters, 10 users, 20 s, output prefix locust_quick")
    args = p.parse_args(argv)
    if args.quick:
        args.adapters, args.users, args.duration = 200, 10, "20s"
        args.out = str(RESULTS / "locust_quick")
    return args


def _pair(text: str) -> list[int]:
    low, high = (int(x) for x in text.split(","))
    return [low, high]


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Throughput, TTFT/latency percentiles and errors from the locust samples."""
    if not samples:
        return {"requests": 0}
    start = min(s["t"] for s in samples)
    end = max(s["t"] + s["latency_s"] for s in samples)
    span = max(end - start, 1e-9)
    ok = [s for s in samples if s["error"] is None]

    def ms(xs: list[float], q: int) -> float | None:
        v = percentile(xs, q)
        return None if v is None else round(v * 1000, 1)

    ttft = [s["ttft_s"] for s in ok if s["stream"] and s["ttft_s"] is not None]
    latency = {
        kind: [s["latency_s"] for s in ok if s["stream"] == streamed]
        for kind, streamed in (("stream", True), ("non_stream", False))
    }
    return {
        "duration_s": round(span, 2),
        "requests": len(samples),
        "ok": len(ok),
        "streamed_ok": sum(1 for s in ok if s["stream"]),
        # Streams whose tokens never formed visible text (random byte model): no TTFT.
        "streamed_without_text": sum(1 for s in ok if s["stream"] and s["ttft_s"] is None),
        "throughput_rps": round(len(ok) / span, 2),
        "throughput_tok_s": round(sum(s["tokens"] for s in ok) / span, 1),
        "ttft_ms": {f"p{q}": ms(ttft, q) for q in (50, 90, 99)},
        "latency_ms": {kind: {f"p{q}": ms(xs, q) for q in (50, 90, 99)}
                       for kind, xs in latency.items()},
        "errors": dict(Counter(s["error"] for s in samples if s["error"])),
        "distinct_users": len({s["user"] for s in samples}),
    }


def plot(samples: list[dict[str, Any]], summary: dict[str, Any], path: Path,
         title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = min(s["t"] for s in samples)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.5))
    seconds = int(summary["duration_s"]) + 1
    done = [0] * seconds
    toks = [0] * seconds
    for s in samples:
        if s["error"] is None:
            second = min(int(s["t"] + s["latency_s"] - start), seconds - 1)
            done[second] += 1
            toks[second] += s["tokens"]
    ax1.plot(range(seconds), done, label="requests/s")
    ax1b = ax1.twinx()
    ax1b.plot(range(seconds), toks, color="tab:orange", alpha=0.6, label="tokens/s")
    ax1.set(xlabel="time (s)", ylabel="completed requests / s", title="throughput")
    ax1b.set_ylabel("completion tokens / s")
    ok_stream = [s for s in samples
                 if s["error"] is None and s["stream"] and s["ttft_s"] is not None]
    ax2.scatter([s["t"] - start for s in ok_stream], [s["ttft_s"] * 1000 for s in ok_stream],
                s=4, alpha=0.5)
    ax2.set(xlabel="request start (s)", ylabel="TTFT (ms)", title="time to first token")
    ttft = sorted(s["ttft_s"] * 1000 for s in ok_stream)
    if ttft:
        ax3.plot(ttft, [(i + 1) / len(ttft) for i in range(len(ttft))], label="TTFT (stream)")
    lat = sorted(s["latency_s"] * 1000 for s in samples if s["error"] is None
                 and not s["stream"])
    if lat:
        ax3.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))],
                 label="latency (non-stream)")
    ax3.set(xlabel="ms", ylabel="fraction of requests", title="CDF", xscale="log")
    ax3.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_locust(args: argparse.Namespace, gateway: str, plan: Path, samples: Path) -> int:
    env = {**os.environ, "PREFT_LOADTEST_PLAN": str(plan),
           "PREFT_LOADTEST_SAMPLES": str(samples)}
    argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
            "-u", str(args.users), "-r", str(args.spawn_rate), "-t", args.duration,
            "--host", gateway, "--csv", args.out, "--only-summary", "--stop-timeout", "60",
            "--loglevel", "WARNING"]
    print("  " + " ".join(shlex.quote(a) for a in argv), flush=True)
    return subprocess.run(argv, env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_at_start = os.getloadavg()[0]
    from preft_serve.toymodels import make_model  # imports torch

    def say(line: str) -> None:
        print(line, flush=True)

    var = args.var.resolve()
    config = StackConfig(var=var, redis_port=free_port(), registry_port=free_port(),
                         worker_port=free_port(), gateway_port=free_port(),
                         worker_args=shlex.split(args.worker_args))
    stack = LocalStack(config, say)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        say(f"[1/5] model and {args.adapters} rank-4 adapters in {var}")
        model = make_model("tiny-llama", var / "model").resolve()
        t0 = time.monotonic()
        adapters = make_adapters(model, var / "adapters", args.adapters,
                                 all_fraction=args.all_fraction)
        say(f"  {len(adapters)} adapters ready in {time.monotonic() - t0:.0f} s")
        # Every run starts with a cold worker cache (hashes repeat between runs).
        shutil.rmtree(config.run_dir / "adapter-cache", ignore_errors=True)
        say("[2/5] stack: worker (background), redis, registry")
        stack.start_worker(model)
        stack.start_redis()
        stack.start_registry(model)
        say(f"[3/5] {args.tenants} tenants, uploads and bindings over REST")
        t0 = time.monotonic()
        bound = seed_tenants(stack, adapters, args.tenants)
        seed_s = time.monotonic() - t0
        say(f"  {len(bound)} adapters uploaded and bound in {seed_s:.0f} s "
            f"({len(bound) / seed_s:.0f}/s)")
        stack.wait_worker()
        stack.start_gateway(model)
        plan_path, samples_path = out.with_suffix(".plan.json"), out.with_suffix(".jsonl")
        plan_path.write_text(json.dumps({
            "users": [[b.api_key, b.user] for b in bound], "model": config.base_model_name,
            "stream_fraction": args.stream_fraction, "max_tokens": _pair(args.max_tokens),
            "prompt_words": _pair(args.prompt_words)}))
        say(f"[4/5] locust: {args.users} users for {args.duration}")
        code = run_locust(args, stack.gateway_url, plan_path, samples_path)
        samples = [json.loads(line) for line in samples_path.read_text().splitlines()]
        say("[5/5] summary")
        summary = summarize(samples)
        result = {
            "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            # Other processes on the machine skew every number; this says how busy it was.
            "load_average_1m_at_start": round(load_at_start, 2),
            "setup": {"adapters": args.adapters, "tenants": args.tenants,
                      "all_fraction": args.all_fraction, "rank": 4, "users": args.users,
                      "duration": args.duration, "stream_fraction": args.stream_fraction,
                      "max_tokens": _pair(args.max_tokens),
                      "prompt_words": _pair(args.prompt_words), "model": "tiny-llama",
                      "worker_args": args.worker_args, "seed_s": round(seed_s, 1),
                      "locust_exit_code": code},
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
            "summary": summary,
            "worker_metrics": scrape(stack.worker_url, WORKER_METRICS),
            "gateway_metrics": scrape(stack.gateway_url, GATEWAY_METRICS),
        }
        out.with_name(out.name + "_summary.json").write_text(json.dumps(result, indent=2))
        if samples:
            plot(samples, summary, out.with_name(out.name + "_summary.png"),
                 f"{args.users} locust users, {args.adapters} adapters, "
                 f"{args.stream_fraction:.0%} streamed ({summary['throughput_rps']} req/s)")
        samples_path.unlink(missing_ok=True)
        for extra in ("_stats_history.csv", "_exceptions.csv"):  # bulky / empty: keep stats
            out.with_name(out.name + extra).unlink(missing_ok=True)
        plan_path.unlink(missing_ok=True)  # holds API keys of a throwaway stack
        print(json.dumps(summary, indent=2))
        say(f"wrote {out}_summary.json, {out}_summary.png, {out}_stats.csv")
        return 0
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()


if __name__ == "__main__":
    raise SystemExit(main())
