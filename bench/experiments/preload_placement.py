"""Does a background adapter parse stretch the model step it overlaps? Placement and GIL A/B.

vLLM's CPU worker binds its main thread (the OpenMP master, which runs every model step)
to the compute CPU(s), and threads it starts later inherit that binding, so the adapter
preloader's parse thread (``preft_serve.worker.adapter_tiers.background_parse``) would
run on the step's own core; it moves itself to the process's other CPUs. This measures
what that is worth, in one process, the placements alternating:

* the main thread is bound to one CPU (as vLLM binds it) and runs back-to-back "steps": a
  fixed single-threaded matmul workload sized like a bench-llama decode step (``--step-ms``);
* meanwhile an :class:`AdapterPreloader` parses real adapters with vLLM's own parser
  (``LoRAModel.from_local_checkpoint``: rank-16 LoRAs on all seven projections of
  SmolLM2-135M's 30 layers, 7 MB+ each) one after another, started from the bound thread
  as in the worker;
* rounds rotate ``inherit`` (the pool thread stays where it starts),
  ``spare`` (it moves to the other CPUs: ``leave_compute_cpus``) and ``spare+paced`` (it
  also hands the GIL back every few hundred interpreter events: ``GilYield``, the default).

Reported per placement: the step time while a parse runs and while none does, their ratio
(1.0: the parse costs the step nothing), steps over 2x the no-parse median, how long a
parse takes, and the step time lost per parse in all (the sum over overlapped steps of
their time beyond the no-parse median). JSON and a plot go to
``var/results/preload_placement.*`` (``--result-dir``). Needs two CPUs or more.

What it found (docs/benchmarks.md): the spare CPU halves how long a parse takes and so the
step time it costs in all, but a step that overlaps a parse is still ~2x as long with
either placement: the parse is Python work under the GIL, and the step thread, which
releases the GIL for every torch op, waits for it on each op (CPython's convoy effect).
Pacing the parse's GIL brings overlapped steps back to ~1.1x; the parse takes longer.

    python -m bench.experiments.preload_placement      # ~2 minutes
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.results import add_result_dir, result_path
from bench.stats import percentile

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PLACEMENTS = ("inherit", "spare", "spare+paced")


def _parser(model: Path) -> Any:
    """vLLM's parse of one adapter directory into host memory (what the worker runs)."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    def parse(folder: Path) -> Any:
        helper = PEFTHelper.from_local_dir(str(folder), 4096)
        return LoRAModel.from_local_checkpoint(
            str(folder), set(PROJECTIONS), helper, device="cpu", dtype=None
        )

    return parse


def _step_workload(target_ms: float) -> Any:
    """A single-threaded matmul loop of about ``target_ms`` (calibrated once)."""
    import torch

    a, b = torch.randn(64, 512), torch.randn(512, 512)

    def step(reps: int) -> None:
        x = a
        for _ in range(reps):
            x = torch.tanh(x @ b)

    step(50)  # warm
    start = time.perf_counter()
    step(200)
    per_rep = (time.perf_counter() - start) / 200
    reps = max(1, round(target_ms / 1000 / per_rep))
    return lambda: step(reps)


def _round(
    placement: str, parse: Any, folders: list[Path], step: Any, idle_steps: int
) -> dict[str, Any]:
    """Steps while the pool parses ``folders`` one after another (and ``idle_steps``
    before, with no parse): (start, seconds, parsing) per step."""
    from preft_serve.worker.adapter_tiers.background_parse import (
        AdapterPreloader,
        GilYield,
        leave_compute_cpus,
    )

    windows: list[tuple[float, float]] = []

    def timed_parse(folder: Path) -> Any:
        start = time.monotonic()
        try:
            return parse(folder)
        finally:
            windows.append((start, time.monotonic()))

    steps: list[tuple[float, float]] = []

    def timed_step() -> None:
        t0 = time.monotonic()
        step()
        steps.append((t0, time.monotonic() - t0))

    preloader = AdapterPreloader(
        timed_parse,
        capacity=len(folders) + 1,
        place_thread=leave_compute_cpus if placement.startswith("spare") else None,
        share_gil=GilYield() if placement.endswith("+paced") else None,
    )
    for _ in range(idle_steps):
        timed_step()
    for i, folder in enumerate(folders):  # submitted from this (bound) thread, as in vLLM
        preloader.submit(i, folder)
    while len(windows) < len(folders):
        timed_step()
    for i in range(len(folders)):
        preloader.discard(i)
    preloader.close()

    def overlaps(t0: float, secs: float) -> bool:
        return any(a < t0 + secs and t0 < b for a, b in windows)

    return {
        "placement": placement,
        "steps": [(t0, secs, overlaps(t0, secs)) for t0, secs in steps],
        "parse_s": [b - a for a, b in windows],
    }


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for placement in PLACEMENTS:
        mine = [r for r in rounds if r["placement"] == placement]
        if not mine:
            continue
        idle = [s for r in mine for _, s, p in r["steps"] if not p]
        during = [s for r in mine for _, s, p in r["steps"] if p]
        idle_median = statistics.median(idle)
        out[placement] = {
            "steps_no_parse": len(idle),
            "steps_during_parse": len(during),
            "no_parse_p50_ms": round(1000 * idle_median, 2),
            "during_parse_p50_ms": round(1000 * statistics.median(during), 2),
            "during_parse_p99_ms": round(1000 * percentile(during, 99, method="lower"), 2),  # type: ignore[operator]
            "during_parse_max_ms": round(1000 * max(during), 2),
            "during_vs_no_parse_p50": round(statistics.median(during) / idle_median, 3),
            "during_parse_over_2x": sum(1 for s in during if s > 2 * idle_median),
            # What the parses cost the steps in all: time beyond a no-parse step, per parse.
            "lost_step_ms_per_parse": round(
                1000 * sum(s - idle_median for s in during) / sum(len(r["parse_s"]) for r in mine),
                2,
            ),
            "parse_ms_p50": round(
                1000 * statistics.median([p for r in mine for p in r["parse_s"]]), 1
            ),
        }
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = result["rounds"]
    fig, axes = plt.subplots(1, len(PLACEMENTS), figsize=(15, 4), sharey=True)
    for ax, placement in zip(axes, PLACEMENTS):
        for r in (r for r in rounds if r["placement"] == placement):
            t0 = r["steps"][0][0]
            for parsing, colour in ((False, "tab:blue"), (True, "tab:red")):
                chosen = [(t - t0, 1000 * s) for t, s, p in r["steps"] if p == parsing]
                ax.scatter(
                    [t for t, _ in chosen],
                    [s for _, s in chosen],
                    s=4,
                    color=colour,
                    label="during a parse" if parsing else "no parse",
                )
        ax.set_title(f"parse thread: {placement}")
        ax.set_xlabel("seconds into the round")
    axes[0].set_ylabel("step (ms)")
    handles, labels = axes[0].get_legend_handles_labels()
    axes[0].legend(handles[:2], labels[:2], fontsize=8)
    fig.suptitle("model steps on the bound CPU while adapters parse in the background")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.experiments.preload_placement",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rounds", type=int, default=9, help="rounds in all, placements in turn")
    p.add_argument("--adapters", type=int, default=24, help="adapters parsed per round")
    p.add_argument(
        "--model",
        default="var/models/smollm2-135m-instruct",
        help="HF model directory whose shapes the adapters take (default: "
        "SmolLM2 from `make model`), or a toymodels preset",
    )
    p.add_argument("--step-ms", type=float, default=12.0, help="one step's work (default 12)")
    p.add_argument("--var", type=Path, default=Path("var/bench/placement"))
    p.add_argument(
        "--out",
        type=Path,
        help="results JSON, a PNG beside it (default RESULT_DIR/preload_placement.json)",
    )
    add_result_dir(p)
    args = p.parse_args(argv)
    args.out = args.out or result_path(args.result_dir, "preload_placement.json")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("error: needs two CPUs or more (one for the steps, one spare)")
        return 1

    import torch

    from bench.stack_setup import write_results
    from preft_serve.toymodels import PRESETS, LoraSpec, make_lora_adapter, make_model

    model = (
        make_model(args.model, args.var / args.model) if args.model in PRESETS else Path(args.model)
    )
    spec = LoraSpec(rank=16, std=0.05, target_modules=PROJECTIONS)
    folders = [
        make_lora_adapter(model, args.var / f"a{i}", seed=i, spec=spec)
        for i in range(args.adapters)
    ]
    parse = _parser(model)
    parse(folders[0])  # warm vLLM's imports
    torch.set_num_threads(1)
    os.sched_setaffinity(0, {cpus[0]})  # this thread: the "compute CPU", as vLLM binds it
    step = _step_workload(args.step_ms)
    from vllm.utils.gc_utils import freeze_gc_heap

    freeze_gc_heap()  # as the worker does after warm-up: no full collection over vLLM's heap
    print(
        f"{len(folders)} adapters of {model.name}; steps of ~{args.step_ms:g} ms on CPU "
        f"{cpus[0]}, {args.rounds} rounds",
        flush=True,
    )
    rounds = []
    for i in range(args.rounds):
        placement = PLACEMENTS[i % len(PLACEMENTS)]
        r = _round(placement, parse, folders, step, idle_steps=40)
        rounds.append(r)
        print(
            f"  round {i + 1}/{args.rounds} ({placement}): "
            f"{sum(1 for *_, p in r['steps'] if p)} steps during "
            f"{len(r['parse_s'])} parses",
            flush=True,
        )
    summary = summarise(rounds)
    cols = [
        "no_parse_p50_ms",
        "during_parse_p50_ms",
        "during_parse_max_ms",
        "during_vs_no_parse_p50",
        "during_parse_over_2x",
        "steps_during_parse",
        "parse_ms_p50",
        "lost_step_ms_per_parse",
    ]
    print(f"\n{'parse thread':<14}" + "".join(f"{c:>24}" for c in cols))
    for placement, row in summary.items():
        print(f"{placement:<14}" + "".join(f"{row[c]:>24}" for c in cols))
    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": cpus,
        "compute_cpu": cpus[0],
        "config": {k: str(v) for k, v in vars(args).items()},
        "summary": summary,
        "rounds": [
            {**r, "steps": [[round(t, 6), round(s, 6), d] for t, s, d in r["steps"]]}
            for r in rounds
        ],
    }
    write_results(args.out, result, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
