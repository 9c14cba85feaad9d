"""Do cold adapters stall the running batch? Inter-token gaps of running streams while
requests for cold adapters arrive, against the same traffic with warm adapters.

One real worker (``python -m preft_serve.worker.serve``) loads adapters by content hash
from a local object store through its disk cache. ``--streams`` long base-model streams run
the whole time; their token arrival times give the engine's step gaps. Meanwhile short
requests (``--rate`` per second) name an adapter, phase by phase:

* ``warm``:       a few adapters already loaded in host memory (requested before timing);
* ``store-cold``: adapters never seen: resolve, download from the store, load, run;
* ``disk-cold``:  the same adapters again, by now evicted from host memory (more of them
                  than ``--max-cpu-loras``) but still on the worker's disk;
* ``warm`` again, so drift on a shared machine shows.

The long streams restart at each phase start, so each phase's gaps come from the same
context lengths.

Reported per phase: the long streams' inter-token gap p50 / p99 / max, gaps over 2x the
warm median, completions per second and the short requests' latency; and the engine's own
steps (``PREFT_STEP_TRACE``, see ``preft_serve.worker.step_trace``) by kind, decode-only
and with prompt tokens (a step that prefills is longer whatever the adapter's
temperature): p50 / p99 / max and steps over 2x the warm phases' median of the same kind.
Client gaps cannot show single steps (vLLM merges a lagging stream's outputs); the trace
can. Ratios are against the warm phases of the same run. JSON + a timeline plot go to
``--result-dir`` (default var/results/).

``--isolate`` leaves the model's compute CPU to the model thread once the worker is up (as
``make bench-gateway`` does): vLLM binds its OpenMP thread to one CPU, and every other
thread — the worker's API server and engine loop, this client — is moved to the others, so
no neighbour takes the step's core. Threads the compute thread starts later inherit its
CPU unless they move themselves (the adapter-parse threads do:
``preft_serve.worker.adapter_tiers.background_parse``). On 2 cores that leaves the API
server, the engine loop and the clients one core between them, which then delivers tokens
late (client-side gaps of seconds in every phase): use it to read engine steps, not client
gaps.

    python -m bench.cold_bench                    # bench-llama, ~3 minutes
    python -m bench.cold_bench --model var/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.results import add_result_dir, result_path
from bench.stats import percentile
from preft_serve.worker.step_trace import ENV as STEP_TRACE_ENV
from preft_serve.worker.step_trace import Step, read_steps

PHASES = ("warm", "store-cold", "disk-cold", "warm-again")


@dataclasses.dataclass
class Timeline:
    """Everything observed, as (monotonic time, value) events."""

    tokens: list[float] = dataclasses.field(default_factory=list)  # long-stream tokens
    gaps: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    done: list[tuple[float, float, str]] = dataclasses.field(default_factory=list)  # t, s, ok
    phases: list[tuple[str, float, float]] = dataclasses.field(default_factory=list)
    epoch: int = 0  # bumped at each phase start: the long streams restart with it
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def _adapters(model: Path, root: Path, count: int) -> list[str]:
    """``count`` rank-16 PreFT LoRAs put into the object store; returns their sha256s."""
    from preft_serve.adapters.format import (
        canonical_config_bytes,
        file_digest,
        read_config,
    )
    from preft_serve.common.objectstore import create_object_store
    from preft_serve.toymodels import LoraSpec, make_lora_adapter

    store = create_object_store(str(root / "objects"), create_root=True)
    shas = []
    for i in range(count):
        folder = make_lora_adapter(
            model, root / "adapters" / f"a{i}", seed=1000 + i, spec=LoraSpec(rank=16, std=0.05)
        )
        config = canonical_config_bytes(read_config(folder))
        weights = folder / "adapter_model.safetensors"
        sha = file_digest(config, weights)
        store.put_adapter(sha, config, weights)
        shas.append(sha)
    return shas


def _long_stream(url: str, prompt: list[int], stop: threading.Event, line: Timeline) -> None:
    """One long base-model stream after another; each is dropped and started afresh when a
    phase starts, so every phase sees the same context lengths (a stream that ran through
    the whole run would make each phase's steps slower than the last's: attention grows
    with the context)."""
    body = {
        "model": "base",
        "prompt": prompt,
        "max_tokens": 3500,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            last = None
            epoch = line.epoch
            try:
                with client.stream("POST", f"{url}/v1/completions", json=body) as reply:
                    for raw in reply.iter_lines():
                        if line.epoch != epoch:
                            break
                        if not raw.startswith("data: {"):
                            continue
                        now = time.monotonic()
                        with line.lock:
                            line.tokens.append(now)
                            if last is not None:
                                line.gaps.append((now, now - last))
                        last = now
                        if stop.is_set():
                            return
            except httpx.RemoteProtocolError:
                if stop.is_set():  # the worker is going away at the end of the run
                    return
                # A pooled connection the server closed as the stream reused it (seen once
                # in a run of four, each stream restarting at every phase): open another.
                continue
            except httpx.HTTPError:
                if stop.is_set():
                    return
                raise


def _short(url: str, sha: str, prompt: list[int], line: Timeline) -> None:
    start = time.monotonic()
    try:
        reply = httpx.post(
            f"{url}/v1/completions",
            timeout=120,
            json={
                "model": f"sha256:{sha}",
                "prompt": prompt,
                "max_tokens": 8,
                "temperature": 0,
                "ignore_eos": True,
            },
        )
        ok = "ok" if reply.status_code == 200 else f"http {reply.status_code}"
    except httpx.HTTPError as exc:
        ok = type(exc).__name__
    end = time.monotonic()
    with line.lock:
        line.done.append((end, end - start, ok))


def _phase(
    name: str,
    url: str,
    shas: list[str],
    seconds: float,
    rate: float,
    prompt_len: int,
    rng: random.Random,
    line: Timeline,
) -> None:
    with line.lock:
        line.epoch += 1
    start = time.monotonic()
    threads = []
    for i in range(int(seconds * rate)):
        due = start + i / rate
        time.sleep(max(0.0, due - time.monotonic()))
        prompt = [rng.randrange(1, 250) for _ in range(prompt_len)]
        t = threading.Thread(target=_short, args=(url, shas[i % len(shas)], prompt, line))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    line.phases.append((name, start, time.monotonic()))


def _pct(values: list[float], q: float) -> float:
    """The ``next-rank`` percentile (``q`` in 0..100); NaN for no values, so an empty phase
    rounds and divides through the summary."""
    value = percentile(values, q, method="next-rank")
    return math.nan if value is None else value


def _kind_stats(steps: list[Step], warm_median: float) -> dict[str, Any]:
    seconds = [s.seconds for s in steps]
    longest = max(seconds, default=float("nan"))
    stats = {
        "steps": len(seconds),
        "p50_ms": round(1000 * _pct(seconds, 50), 2),
        "p99_ms": round(1000 * _pct(seconds, 99), 2),
        "max_ms": round(1000 * longest, 2),
        "max_vs_warm_median": round(longest / warm_median, 2),
        "over_2x_warm_median": sum(1 for x in seconds if x > 2 * warm_median),
    }
    adapter = [s.adapter_seconds for s in steps if s.adapter_seconds is not None]
    if adapter and len(adapter) == len(steps):
        # The adapter-preparation part of the steps (mapping, parse waits, slot copies),
        # and how much of the longest step it was.
        slowest = max(steps, key=lambda s: s.seconds)
        stats.update(
            {
                "adapter_p50_ms": round(1000 * _pct(adapter, 50), 2),
                "adapter_p99_ms": round(1000 * _pct(adapter, 99), 2),
                "adapter_max_ms": round(1000 * max(adapter), 2),
                "adapter_share": round(sum(adapter) / sum(seconds), 3),
                "longest_step_adapter_ms": round(1000 * (slowest.adapter_seconds or 0.0), 2),
            }
        )
    return stats


def summarise_steps(line: Timeline, steps: list[Step]) -> dict[str, Any]:
    """The engine's steps per phase (by start time), by kind, each kind against the warm
    phases' median step of the same kind: decode-only steps (one token per request) and
    steps with prompt tokens (a cold adapter's slot copy lands in its request's first
    prefill step, and a prefill step is longer than a decode step in any phase)."""

    def within(a: float, b: float) -> list[Step]:
        return [s for s in steps if a <= s.start <= b]

    kinds = {"decode": lambda s: s.decode_only, "prefill": lambda s: not s.decode_only}
    warm = [s for name, a, b in line.phases if name.startswith("warm") for s in within(a, b)]
    medians = {
        kind: statistics.median([s.seconds for s in warm if of(s)])
        for kind, of in kinds.items()
        if any(of(s) for s in warm)
    }
    if not medians:
        return {}
    return {
        "warm_median_ms": {k: round(1000 * m, 2) for k, m in medians.items()},
        "phases": {
            name: {
                kind: _kind_stats([s for s in within(a, b) if of(s)], medians[kind])
                for kind, of in kinds.items()
                if kind in medians
            }
            for name, a, b in line.phases
        },
    }


def summarise(line: Timeline) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    warm_gaps = [
        g
        for name, a, b in line.phases
        if name.startswith("warm")
        for t, g in line.gaps
        if a <= t <= b
    ]
    warm_median = statistics.median(warm_gaps) if warm_gaps else float("nan")
    for name, a, b in line.phases:
        gaps = [g for t, g in line.gaps if a <= t <= b]
        done = [(s, ok) for t, s, ok in line.done if a <= t <= b]
        rows[name] = {
            "seconds": round(b - a, 2),
            "stream_tokens_per_s": round(sum(1 for t in line.tokens if a <= t <= b) / (b - a), 1),
            "gap_p50_ms": round(1000 * _pct(gaps, 50), 1),
            "gap_p99_ms": round(1000 * _pct(gaps, 99), 1),
            "gap_max_ms": round(1000 * max(gaps, default=float("nan")), 1),
            "gaps_over_2x_warm_median": sum(1 for g in gaps if g > 2 * warm_median),
            "completions": sum(1 for _, ok in done if ok == "ok"),
            "errors": sum(1 for _, ok in done if ok != "ok"),
            "latency_p50_ms": round(1000 * _pct([s for s, _ in done], 50), 1),
            "latency_p99_ms": round(1000 * _pct([s for s, _ in done], 99), 1),
        }
    warm = [rows[p] for p in ("warm", "warm-again") if p in rows]
    for name in ("store-cold", "disk-cold"):
        if name in rows and warm:
            base_p99 = statistics.mean(r["gap_p99_ms"] for r in warm)
            base_tps = statistics.mean(r["stream_tokens_per_s"] for r in warm)
            rows[name]["gap_p99_vs_warm"] = round(rows[name]["gap_p99_ms"] / base_p99, 2)
            rows[name]["stream_tokens_vs_warm"] = round(
                rows[name]["stream_tokens_per_s"] / base_tps, 2
            )
    return {"warm_gap_median_ms": round(1000 * warm_median, 1), "phases": rows}


def plot(line: Timeline, summary: dict[str, Any], path: Path, steps: list[Step]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = line.phases[0][1]
    fig, (engine, top, bottom) = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    for decode, colour, label in (
        (True, "tab:blue", "decode only"),
        (False, "tab:orange", "with prompt tokens"),
    ):
        chosen = [s for s in steps if s.decode_only == decode and s.start >= t0]
        engine.scatter(
            [s.start - t0 for s in chosen],
            [1000 * s.seconds for s in chosen],
            s=3,
            color=colour,
            label=label,
        )
    engine.set_ylabel("engine step (ms)")
    engine.set_yscale("log")
    engine.legend(fontsize=7, loc="upper right")
    top.scatter([t - t0 for t, _ in line.gaps], [1000 * g for _, g in line.gaps], s=3)
    top.set_ylabel("inter-token gap of\nrunning streams (ms)")
    top.set_yscale("log")
    width = 0.5
    end = line.phases[-1][2] - t0
    bins = [i * width for i in range(int(end / width) + 2)]
    bottom.hist([t - t0 for t, _, ok in line.done if ok == "ok"], bins=bins)
    bottom.set_ylabel("short completions\nper 0.5 s")
    bottom.set_xlabel("seconds")
    colours = {"warm": "#dfd", "store-cold": "#fdd", "disk-cold": "#ffd", "warm-again": "#dfd"}
    for name, a, b in line.phases:
        for ax in (engine, top, bottom):
            ax.axvspan(a - t0, b - t0, color=colours[name], zorder=0)
        engine.text((a + b) / 2 - t0, engine.get_ylim()[1], name, ha="center", va="top")
    cold = summary["phases"].get("store-cold", {})
    fig.suptitle(
        f"running streams while cold adapters load: store-cold p99 gap "
        f"{cold.get('gap_p99_vs_warm')}x warm, stream tokens/s "
        f"{cold.get('stream_tokens_vs_warm')}x warm"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.cold_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        default="bench-llama",
        help="HF model directory or a toymodels preset (default bench-llama)",
    )
    p.add_argument("--adapters", type=int, default=48, help="cold adapters (default 48)")
    p.add_argument("--streams", type=int, default=4, help="long base-model streams")
    p.add_argument("--rate", type=float, default=3.0, help="short requests per second")
    p.add_argument("--seconds", type=float, default=20.0, help="per phase")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-cpu-loras", type=int, default=16)
    p.add_argument("--var", type=Path, default=Path("var/bench/cold"))
    p.add_argument(
        "--out",
        type=Path,
        help="results JSON, a PNG beside it (default RESULT_DIR/cold_bench.json)",
    )
    add_result_dir(p)
    p.add_argument(
        "--isolate",
        action="store_true",
        help="leave the model's compute CPU to the model thread alone",
    )
    args = p.parse_args(argv)
    args.out = args.out or result_path(args.result_dir, "cold_bench.json")

    from preft_serve.onebox import Child, free_port
    from preft_serve.toymodels import PRESETS, make_model

    model = (
        make_model(args.model, args.var / args.model) if args.model in PRESETS else Path(args.model)
    )
    print(f"[1/3] {args.adapters + 8} adapters into the object store", flush=True)
    shas = _adapters(model, args.var, args.adapters + 8)
    warm, cold = shas[:8], shas[8:]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cache = args.var / f"cache-{int(time.time())}"
    trace = (args.var / f"steps-{int(time.time())}.txt").resolve()
    print("[2/3] worker", flush=True)
    worker = Child(
        "worker",
        [
            sys.executable,
            "-m",
            "preft_serve.worker.serve",
            "--model",
            str(model),
            "--port",
            str(port),
            "--object-store",
            str((args.var / "objects").resolve()),
            "--adapter-cache-dir",
            str(cache.resolve()),
            "--max-loras",
            "8",
            "--max-cpu-loras",
            str(args.max_cpu_loras),
            "--max-model-len",
            "4096",
            "--served-model-name",
            "base",
            "--kv-cache-gib",
            "0.5",
        ],
        args.var / "worker.log",
        env={STEP_TRACE_ENV: str(trace)},
    )
    rng = random.Random(0)
    line = Timeline()
    stop = threading.Event()
    isolation: dict[str, Any] = {"model_cpus": [], "moved_threads": 0}
    try:
        worker.wait_ready(
            lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200, 600, 0.5
        )
        if args.isolate:
            from bench.stack_setup import group_pids, isolate_model_cpus

            model_cpus, moved = isolate_model_cpus(group_pids(worker.pid))
            isolation = {"model_cpus": sorted(model_cpus), "moved_threads": len(moved)}
            print(
                f"  model CPU(s) {sorted(model_cpus)} left to the model thread; "
                f"{len(moved)} other threads moved",
                flush=True,
            )
        for sha in warm:  # untimed: the warm set is resident before timing starts
            _short(url, sha, [1, 2, 3], Timeline())
        streams = [
            threading.Thread(
                target=_long_stream,
                daemon=True,
                args=(url, [rng.randrange(1, 250) for _ in range(args.prompt_len)], stop, line),
            )
            for _ in range(args.streams)
        ]
        for s in streams:
            s.start()
        time.sleep(5)  # streams past their prefill
        print(f"[3/3] phases of {args.seconds:.0f} s: {', '.join(PHASES)}", flush=True)
        for name in PHASES:
            chosen = warm if name.startswith("warm") else cold
            _phase(name, url, chosen, args.seconds, args.rate, args.prompt_len, rng, line)
            print(f"  {name}: done", flush=True)
    finally:
        stop.set()
        worker.stop()
    steps = read_steps(trace) if trace.exists() else []
    summary = {
        "config": {k: str(v) for k, v in vars(args).items()},
        "isolation": isolation,
        **summarise(line),
        "engine_steps": summarise_steps(line, steps),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1))
    plot(line, summary, args.out.with_suffix(".png"), steps)
    cols = [
        "gap_p50_ms",
        "gap_p99_ms",
        "gap_max_ms",
        "gaps_over_2x_warm_median",
        "stream_tokens_per_s",
        "completions",
        "errors",
        "latency_p99_ms",
    ]
    print(f"\n{'phase':<12}" + "".join(f"{c:>26}" for c in cols))
    for name, row in summary["phases"].items():
        print(f"{name:<12}" + "".join(f"{row[c]:>26}" for c in cols))
    engine = summary["engine_steps"]
    if engine:
        cols = [
            "steps",
            "p50_ms",
            "p99_ms",
            "max_ms",
            "max_vs_warm_median",
            "over_2x_warm_median",
            "adapter_p50_ms",
            "adapter_max_ms",
            "adapter_share",
            "longest_step_adapter_ms",
        ]
        print(f"\nengine steps by kind (warm medians {engine['warm_median_ms']} ms)")
        print(f"{'phase':<12}{'kind':<9}" + "".join(f"{c:>21}" for c in cols))
        for name, by_kind in engine["phases"].items():
            for kind, row in by_kind.items():
                print(f"{name:<12}{kind:<9}" + "".join(f"{row.get(c, '-'):>21}" for c in cols))
    else:
        print(f"\nno engine step trace at {trace}")
    for name in ("store-cold", "disk-cold"):
        row = summary["phases"][name]
        print(
            f"{name}: p99 gap {row['gap_p99_vs_warm']}x warm, stream tokens/s "
            f"{row['stream_tokens_vs_warm']}x warm"
        )
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
