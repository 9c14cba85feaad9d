"""Load test: locust users through the gateway, spread over thousands of bound adapters.

Brings up a local stack (:mod:`preft_serve.onebox`: Redis, registry, ``--workers`` CPU
workers (one by default), gateway) under ``--var``, creates ``--adapters`` rank-4 LoRA
adapters with distinct seeds (so distinct hashes), uploads them over the registry's REST API
to ``--tenants`` tenants and binds one user per adapter, then runs locust headless
(``bench/locustfile.py``): ``--users`` concurrent clients, each sending chat completions
back to back for random users (uniformly, or with ``--zipf S`` with Zipf(S) popularity
over the users, so over the adapters: :mod:`bench.popularity`), ``--stream-fraction``
of them streamed. Writes
``<out>_summary.json`` (throughput in requests/s and completion tokens/s, TTFT and latency
percentiles, errors by type, worker adapter loads, gateway routing, the engine's own
steps from its step trace, and where requests' time went: the gateway's and vLLM's
latency histograms over the run, :mod:`bench.scale_sim.outside`),
``<out>_summary.png``, locust's CSVs and ``<out>_steps.json`` (every worker's engine steps
during the run, their mean object-store fetch, and per request locust's and the gateway's
times, which the scale simulator replays: :mod:`bench.scale_sim.stalls`).

The engine part says whether a dip in completions happened in the engine or before it: a
long step stalls every running request; a second of many small steps with few scheduled
tokens ("starved") means requests were not reaching the scheduler (docs/benchmarks.md,
"Where the stalls are not").

    python -m bench.loadtest --adapters 2000 --users 50 --duration 60s
    python -m bench.loadtest --quick          # 200 adapters, 10 users, 20 s
    python -m bench.loadtest --workers 2 --out var/results/locust_2w
    # then: python -m bench.scale_sim --scenario validate \
    #           --recorded var/results/locust_2w_summary.json   (docs/scale.md)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
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

from bench.results import add_result_dir, result_path
from bench.scale_sim import outside, stalls
from bench.stack_setup import make_adapters, scrape, seed_tenants
from bench.stats import percentile
from preft_serve.gateway.routing import RESIDENT_SLACK
from preft_serve.onebox import OneBox, StackConfig, StackError, free_port
from preft_serve.onebox.stack import http_ok
from preft_serve.worker.step_trace import ENV as STEP_TRACE_ENV
from preft_serve.worker.step_trace import Step, read_steps

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
WORKER_METRICS = ("preft_worker_adapter_loads_total", "preft_worker_adapter_evictions_total")
FETCH_METRICS = ("preft_worker_adapter_load_seconds_sum", "preft_worker_adapter_load_seconds_count")
GATEWAY_METRICS = ("preft_gateway_routing_total", "preft_gateway_errors_total")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.loadtest",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--adapters", type=int, default=2000)
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument(
        "--all-fraction",
        type=float,
        default=0.0,
        help="share of adapters uploaded in mode 'all' (rest: prefill)",
    )
    p.add_argument("--users", type=int, default=50, help="concurrent locust users")
    p.add_argument("--spawn-rate", type=float, default=10)
    p.add_argument("--duration", default="60s", help="locust --run-time (e.g. 60s, 5m)")
    p.add_argument("--stream-fraction", type=float, default=0.5)
    p.add_argument("--max-tokens", default="8,32", help="min,max completion tokens")
    p.add_argument("--prompt-words", default="4,40", help="min,max prompt words")
    p.add_argument(
        "--zipf",
        type=float,
        default=0.0,
        metavar="S",
        help="Zipf(S) popularity of the users (one per adapter) instead of "
        "uniform (0, the default); the top adapter's share over 2,000 is "
        "12.2%% at S=1, 22.2%% at 1.2",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds the popularity ranks and every locust user's draws",
    )
    p.add_argument("--var", type=Path, default=Path("var/loadtest"))
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="CPU workers behind the gateway, each with its own adapter cache "
        "(default 1); engine numbers are the first worker's",
    )
    p.add_argument(
        "--worker-args",
        default="--max-num-seqs 64",
        help="extra worker/vLLM flags, one shell-quoted string",
    )
    p.add_argument(
        "--gateway-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a gateway setting for this run (repeatable), e.g. "
        "PREFT_GATEWAY_LOAD_FACTOR=1.5; recorded in the summary's setup",
    )
    p.add_argument("--out", help="output prefix (default RESULT_DIR/locust)")
    add_result_dir(p)
    p.add_argument(
        "--quick",
        action="store_true",
        help="200 adapters, 10 users, 20 s, output prefix locust_quick",
    )
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error("--workers must be at least 1")
    if args.zipf < 0:
        p.error("--zipf must be at least 0")
    if any("=" not in kv for kv in args.gateway_env):
        p.error("--gateway-env takes NAME=VALUE")
    if args.quick:
        args.adapters, args.users, args.duration = 200, 10, "20s"
        args.out = args.out or str(result_path(args.result_dir, "locust_quick"))
    args.out = args.out or str(result_path(args.result_dir, "locust"))
    return args


def scrape_sum(urls: list[str], names: tuple[str, ...]) -> dict[str, float]:
    """:func:`scrape` summed over workers: the cluster's adapter loads by tier and outcome."""
    total: dict[str, float] = {}
    for url in urls:
        for key, value in scrape(url, names).items():
            total[key] = total.get(key, 0.0) + value
    return total


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
        "latency_ms": {
            kind: {f"p{q}": ms(xs, q) for q in (50, 90, 99)} for kind, xs in latency.items()
        },
        "errors": dict(Counter(s["error"] for s in samples if s["error"])),
        "distinct_users": len({s["user"] for s in samples}),
    }


STARVED = 0.5
"""A second whose scheduled tokens are under this share of the median second's."""


def engine_seconds(steps: list[Step], start: float, seconds: int) -> list[dict[str, float]]:
    """Per second from ``start`` (monotonic): steps begun, tokens they scheduled, and the
    share of the second the engine was busy in them."""
    out = [{"steps": 0, "tokens": 0, "busy": 0.0} for _ in range(seconds)]
    for step in steps:
        second = math.floor(step.start - start)  # int() would put -0.5 in second 0
        if 0 <= second < seconds:
            out[second]["steps"] += 1
            out[second]["tokens"] += step.tokens
            out[second]["busy"] += step.seconds
    return [{**o, "busy": round(o["busy"], 3)} for o in out]


def engine_summary(
    steps: list[Step], start: float, seconds: int, steady: tuple[int, int] | None = None
) -> dict[str, Any]:
    """The engine's steps during the run: step times, and the seconds it was starved.

    ``steady``: the seconds ``[first, last)`` with every client running (not the ramp-up
    while locust spawns users, nor the last, partial seconds); token rates and starved
    seconds are taken there only."""
    steps = [s for s in steps if start <= s.start < start + seconds]
    if not steps:
        return {"steps": 0}
    per_second = engine_seconds(steps, start, seconds)
    first, last = steady or (0, seconds)
    window = range(max(first, 0), min(last, seconds))
    if not window:
        window = range(seconds)
    tokens = [per_second[i]["tokens"] for i in window]
    median_tokens = percentile(tokens, 50) or 0
    durations = [s.seconds for s in steps]
    return {
        "steps": len(steps),
        "median_step_ms": round(1000 * (percentile(durations, 50) or 0), 1),
        "longest_step_ms": round(1000 * max(durations), 1),
        "busy_share": round(sum(durations) / seconds, 3),
        "scheduled_tokens_per_s": {"median": median_tokens, "lowest": min(tokens)},
        "steady_seconds": [window.start, window.stop],
        "starved_seconds": [i for i in window if per_second[i]["tokens"] < STARVED * median_tokens],
        "per_second": per_second,
    }


def plot(
    samples: list[dict[str, Any]],
    summary: dict[str, Any],
    path: Path,
    title: str,
    engine: dict[str, Any] | None = None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = min(s["t"] for s in samples)
    fig, (ax1, ax4, ax2, ax3) = plt.subplots(1, 4, figsize=(21, 4.5))
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
    per_second = (engine or {}).get("per_second") or []
    ax4.plot(range(len(per_second)), [s["tokens"] for s in per_second], label="tokens")
    ax4b = ax4.twinx()
    ax4b.plot(
        range(len(per_second)),
        [s["steps"] for s in per_second],
        color="tab:green",
        alpha=0.6,
        label="steps",
    )
    for second in (engine or {}).get("starved_seconds", []):
        ax4.axvspan(second, second + 1, color="tab:red", alpha=0.15)
    ax4.set(xlabel="time (s)", ylabel="scheduled tokens / s", title="engine (red: starved seconds)")
    ax4b.set_ylabel("engine steps / s")
    ok_stream = [
        s for s in samples if s["error"] is None and s["stream"] and s["ttft_s"] is not None
    ]
    ax2.scatter(
        [s["t"] - start for s in ok_stream], [s["ttft_s"] * 1000 for s in ok_stream], s=4, alpha=0.5
    )
    ax2.set(xlabel="request start (s)", ylabel="TTFT (ms)", title="time to first token")
    ttft = sorted(s["ttft_s"] * 1000 for s in ok_stream)
    if ttft:
        ax3.plot(ttft, [(i + 1) / len(ttft) for i in range(len(ttft))], label="TTFT (stream)")
    lat = sorted(s["latency_s"] * 1000 for s in samples if s["error"] is None and not s["stream"])
    if lat:
        ax3.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label="latency (non-stream)")
    ax3.set(xlabel="ms", ylabel="fraction of requests", title="CDF", xscale="log")
    ax3.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def cap_on_worker_load(env: dict[str, str]) -> bool:
    """Whether the run's gateway holds its cap against the workers' own load (the setting,
    where this gateway version has it; the simulator routes the same way)."""
    from preft_serve.gateway.settings import GatewaySettings

    field = GatewaySettings.model_fields.get("cap_on_worker_load")
    value = env.get("PREFT_GATEWAY_CAP_ON_WORKER_LOAD")
    if field is None:
        return False
    return bool(field.default) if value is None else value.lower() in ("1", "true", "yes")


def run_locust(args: argparse.Namespace, gateway: str, plan: Path, samples: Path) -> int:
    env = {**os.environ, "PREFT_LOADTEST_PLAN": str(plan), "PREFT_LOADTEST_SAMPLES": str(samples)}
    argv = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "-u",
        str(args.users),
        "-r",
        str(args.spawn_rate),
        "-t",
        args.duration,
        "--host",
        gateway,
        "--csv",
        args.out,
        "--only-summary",
        "--stop-timeout",
        "60",
        "--loglevel",
        "WARNING",
    ]
    print("  " + " ".join(shlex.quote(a) for a in argv), flush=True)
    return subprocess.run(argv, env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_at_start = os.getloadavg()[0]
    from preft_serve.toymodels import make_model  # imports torch

    def say(line: str) -> None:
        print(line, flush=True)

    var = args.var.resolve()
    trace = var / "steps.txt"
    config = StackConfig(
        var=var,
        redis_port=free_port(),
        registry_port=free_port(),
        worker_port=free_port(),
        gateway_port=free_port(),
        worker_args=shlex.split(args.worker_args),
        worker_env={STEP_TRACE_ENV: str(trace)},
    )
    stack = OneBox(config, say)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        say(f"[1/5] model and {args.adapters} rank-4 adapters in {var}")
        model = make_model("tiny-llama", var / "model").resolve()
        t0 = time.monotonic()
        adapters = make_adapters(
            model, var / "adapters", args.adapters, all_fraction=args.all_fraction
        )
        say(f"  {len(adapters)} adapters ready in {time.monotonic() - t0:.0f} s")
        # Every run starts with cold worker caches (hashes repeat between runs).
        extra = {
            f"worker{i + 1}": (free_port(), config.run_dir / f"adapter-cache-{i + 1}")
            for i in range(1, args.workers)
        }
        # Every worker traces its engine's steps: the simulator replays their pauses.
        traces = {"worker": trace, **{name: var / f"steps-{name}.txt" for name in extra}}
        for path in traces.values():
            path.unlink(missing_ok=True)
        for cache in [config.run_dir / "adapter-cache", *(c for _, c in extra.values())]:
            shutil.rmtree(cache, ignore_errors=True)
        trace.parent.mkdir(parents=True, exist_ok=True)
        say(f"[2/5] stack: {args.workers} worker(s) (background), redis, registry")
        stack.start_worker(model)
        others = {
            name: stack.start(
                name, stack.worker_command(model, port, cache), {STEP_TRACE_ENV: str(traces[name])}
            )
            for name, (port, cache) in extra.items()
        }
        worker_urls = [
            stack.worker_url,
            *(f"http://127.0.0.1:{port}" for port, _ in extra.values()),
        ]
        stack.start_redis()
        stack.start_registry(model)
        say(f"[3/5] {args.tenants} tenants, uploads and bindings over REST")
        t0 = time.monotonic()
        bound = seed_tenants(stack, adapters, args.tenants)
        seed_s = time.monotonic() - t0
        say(
            f"  {len(bound)} adapters uploaded and bound in {seed_s:.0f} s "
            f"({len(bound) / seed_s:.0f}/s)"
        )
        stack.wait_worker()
        for url, child in zip(worker_urls[1:], others.values(), strict=True):
            child.wait_ready(http_ok(f"{url}/health"), config.worker_timeout_s, 0.5)
        gateway_env = dict(kv.split("=", 1) for kv in args.gateway_env)
        # JSON access lines: each request's gateway-side time, joined to locust's by id.
        stack.start_gateway(
            model, worker_urls, extra_env={**gateway_env, "PREFT_GATEWAY_LOG_JSON": "true"}
        )
        plan_path, samples_path = out.with_suffix(".plan.json"), out.with_suffix(".jsonl")
        plan_path.write_text(
            json.dumps(
                {
                    "users": [[b.api_key, b.user] for b in bound],
                    "model": config.base_model_name,
                    "stream_fraction": args.stream_fraction,
                    "max_tokens": _pair(args.max_tokens),
                    "prompt_words": _pair(args.prompt_words),
                    "zipf": args.zipf,
                    "seed": args.seed,
                }
            )
        )
        say(f"[4/5] locust: {args.users} users for {args.duration}")
        before = outside.scrape(stack.gateway_url, worker_urls)
        code = run_locust(args, stack.gateway_url, plan_path, samples_path)
        after = outside.scrape(stack.gateway_url, worker_urls)
        samples = [json.loads(line) for line in samples_path.read_text().splitlines()]
        rows = outside.request_rows(
            samples, outside.access_log(config.log_dir / "gateway.log"), worker_urls
        )
        say("[5/5] summary")
        summary = summarize(samples)
        engine: dict[str, Any] = {"steps": 0}
        if samples and trace.exists():
            # Samples carry wall-clock times, the trace the system-wide monotonic clock.
            wall_minus_mono = time.time() - time.monotonic()
            first = min(s["t"] for s in samples) - wall_minus_mono
            seconds = int(summary["duration_s"]) + 1
            ramp_s = math.ceil(args.users / args.spawn_rate)
            engine = engine_summary(read_steps(trace), first, seconds, steady=(ramp_s, seconds - 2))
            fetched = scrape_sum(worker_urls, FETCH_METRICS)
            count = fetched.get("preft_worker_adapter_load_seconds_count{tier=disk}", 0.0)
            total = fetched.get("preft_worker_adapter_load_seconds_sum{tier=disk}", 0.0)
            steps = stalls.steps_file(
                {name: read_steps(path) for name, path in traces.items() if path.exists()},
                (1000 * total / count if count else 0.0, int(count)),
                first,
                first + seconds,
                f"{args.workers} worker(s)' engine steps during the load test "
                "(PREFT_STEP_TRACE), their object-store fetches, and per request locust's "
                "and the gateway's times",
            )
            steps["request_columns"] = ["sent_s", "locust_ms", "gateway_ms", "ttft_ms", "worker"]
            steps["requests"] = rows
            out.with_name(out.name + "_steps.json").write_text(json.dumps(steps) + "\n")
        timing = outside.timing_section(samples, rows, before, after)
        result = {
            "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            # Other processes on the machine skew every number; this says how busy it was.
            "load_average_1m_at_start": round(load_at_start, 2),
            "setup": {
                "adapters": args.adapters,
                "tenants": args.tenants,
                "all_fraction": args.all_fraction,
                "rank": 4,
                "users": args.users,
                "duration": args.duration,
                "stream_fraction": args.stream_fraction,
                "max_tokens": _pair(args.max_tokens),
                "prompt_words": _pair(args.prompt_words),
                "model": "tiny-llama",
                "workers": args.workers,
                "zipf": args.zipf,
                "seed": args.seed,
                "gateway_env": gateway_env,
                "cap_on_worker_load": cap_on_worker_load(gateway_env),
                # the simulator replays a recording with the routing its gateways had
                "resident_slack": RESIDENT_SLACK,
                "worker_args": args.worker_args,
                "seed_s": round(seed_s, 1),
                "locust_exit_code": code,
            },
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
            "summary": summary,
            "engine": engine,
            "worker_metrics": scrape_sum(worker_urls, WORKER_METRICS),
            "gateway_metrics": scrape(stack.gateway_url, GATEWAY_METRICS),
            "timing": timing,
        }
        out.with_name(out.name + "_summary.json").write_text(json.dumps(result, indent=2))
        if samples:
            plot(
                samples,
                summary,
                out.with_name(out.name + "_summary.png"),
                f"{args.users} locust users, {args.adapters} adapters, "
                f"{args.stream_fraction:.0%} streamed ({summary['throughput_rps']} req/s)",
                engine,
            )
        samples_path.unlink(missing_ok=True)
        for suffix in ("_stats_history.csv", "_exceptions.csv"):  # bulky / empty: keep stats
            out.with_name(out.name + suffix).unlink(missing_ok=True)
        plan_path.unlink(missing_ok=True)  # holds API keys of a throwaway stack
        print(json.dumps(summary, indent=2))
        if "breakdown_ms" in timing:
            say(f"  where the mean request's time went (ms): {json.dumps(timing['breakdown_ms'])}")
        if engine["steps"]:
            say(
                f"  engine: {engine['steps']} steps, median {engine['median_step_ms']} ms, "
                f"longest {engine['longest_step_ms']} ms; scheduled tokens/s median "
                f"{engine['scheduled_tokens_per_s']['median']}, lowest "
                f"{engine['scheduled_tokens_per_s']['lowest']}; starved seconds "
                f"{engine['starved_seconds'] or 'none'}"
            )
        say(f"wrote {out}_summary.json, {out}_summary.png, {out}_stats.csv, {out}_steps.json")
        return 0
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()


if __name__ == "__main__":
    raise SystemExit(main())
