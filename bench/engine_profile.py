"""Where an engine step's time goes: CPU milliseconds per step by part, base vs an adapter mode.

One process, engines in-process (no engine-core subprocess), one compute thread; the same
workload as ``bench.engine_bench`` (``--quick`` sizes by default). Every part is timed
in *thread CPU time* (``time.thread_time_ns``) by wrapping the method that does it, so a
neighbour on the machine does not count:

- ``schedule`` / ``update_from_output``: vLLM's scheduler (with the PreFT slot mixin);
- ``execute_model``: the model runner's step (inputs, forward, logits), which contains
  ``set_active_loras`` (token->adapter mapping, slot activation, the punica metadata:
  ``update_metadata``; slot copies: ``activate_adapter``), the forward's LoRA calls
  (``add_lora_linear`` split by projection: qkv, o, gate_up, down; ``add_lora_embedding``,
  ``add_lora_logits``), and the ReFT runtime (``prepare_step``, its layer hooks);
- ``sample_tokens``: sampling.

    python -m bench.engine_profile --mode preft-lora [--adapters 64 --max-loras 8]
    python -m bench.engine_profile --mode preft-lora --torch-profile 25

Parts nest (``execute_model`` contains the LoRA calls), so they do not sum to the step.
Steps with and without prompt tokens are counted apart (``prefill`` / ``decode`` steps).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import engine_bench
from bench.engine_bench import BenchEngine, Shape
from bench.results import result_path

SLICES_LABEL = {3: "qkv", 2: "gate_up"}


class Timers:
    """Thread-CPU nanoseconds and calls per part, split by the kind of the current step."""

    def __init__(self) -> None:
        self.ns: dict[tuple[str, str], int] = collections.defaultdict(int)
        self.calls: dict[tuple[str, str], int] = collections.defaultdict(int)
        self.steps: collections.Counter[str] = collections.Counter()
        self.step_kind = "decode"
        self.on = False

    def reset(self) -> None:
        self.ns.clear()
        self.calls.clear()
        self.steps.clear()

    def add(self, part: str, ns: int) -> None:
        self.ns[(self.step_kind, part)] += ns
        self.calls[(self.step_kind, part)] += 1

    def table(self) -> dict[str, dict[str, float]]:
        """``{step kind: {part: ms per step}}`` plus ``calls per step`` and step counts."""
        out: dict[str, dict[str, float]] = {}
        for kind in ("all", "prefill", "decode"):
            steps = sum(self.steps.values()) if kind == "all" else self.steps[kind]
            if not steps:
                continue
            parts: dict[str, float] = {"steps": steps}
            for (k, part), ns in sorted(self.ns.items(), key=lambda kv: -kv[1]):
                if kind in ("all", k):
                    parts[part] = parts.get(part, 0.0) + ns / 1e6 / steps
            out[kind] = {p: round(v, 3) for p, v in parts.items()}
        return out


TIMERS = Timers()


def _wrap(owner: type, name: str, part: str | Callable[..., str]) -> None:
    """Time ``owner.name`` under ``part`` (or ``part(*args)``) while timers are on."""
    original = owner.__dict__.get(name) or getattr(owner, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if not TIMERS.on:
            return original(*args, **kwargs)
        t0 = time.thread_time_ns()
        try:
            return original(*args, **kwargs)
        finally:
            TIMERS.add(
                part(*args, **kwargs) if callable(part) else part, time.thread_time_ns() - t0
            )

    setattr(owner, name, timed)


def instrument() -> None:
    """Wrap the parts (before any engine exists; classes, not instances)."""
    from vllm.lora.model_manager import LoRAModelManager
    from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.lora_model_runner_mixin import LoRAModelRunnerMixin

    from preft_serve.worker import vllm_compat
    from preft_serve.worker.reft.runtime import ReftRuntime
    from preft_serve.worker.vllm_compat.model_runner import PreftLoRAMappingMixin
    from preft_serve.worker.vllm_compat.punica_cpu import GroupedPunicaWrapperCPU

    vllm_compat.install()
    wrapper = GroupedPunicaWrapperCPU
    _wrap(Scheduler, "schedule", "schedule")
    _wrap(Scheduler, "update_from_output", "update_from_output")
    _wrap(GPUModelRunner, "sample_tokens", "sample_tokens")
    _wrap(PreftLoRAMappingMixin, "set_active_loras", "  set_active_loras")
    _wrap(LoRAModelRunnerMixin, "_set_active_loras", "    _set_active_loras (vLLM)")
    _wrap(LRUCacheWorkerLoRAManager, "_apply_adapters", "      _apply_adapters (vLLM)")
    _wrap(wrapper, "update_metadata", "      update_metadata (punica)")
    _wrap(LoRAModelManager, "activate_adapter", "        activate_adapter (slot copy)")
    _wrap(wrapper, "add_lora_linear", _linear_label)
    _wrap(wrapper, "add_lora_embedding", "  lora embedding")
    _wrap(wrapper, "add_lora_logits", "  lora logits")
    _wrap(ReftRuntime, "prepare_step", "  reft prepare_step")
    _wrap(GPUModelRunner, "_model_forward", "  model forward")
    original = GPUModelRunner.execute_model

    @functools.wraps(original)
    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if not TIMERS.on:
            return original(self, scheduler_output, *args, **kwargs)
        TIMERS.step_kind = "prefill" if _has_prompt_tokens(self, scheduler_output) else "decode"
        TIMERS.steps[TIMERS.step_kind] += 1
        t0 = time.thread_time_ns()
        try:
            return original(self, scheduler_output, *args, **kwargs)
        finally:
            TIMERS.add("execute_model", time.thread_time_ns() - t0)

    GPUModelRunner.execute_model = execute_model  # type: ignore[method-assign]


def _has_prompt_tokens(runner: Any, scheduler_output: Any) -> bool:
    """Whether any request of the step computes prompt tokens (a new or partial prefill)."""
    if scheduler_output.scheduled_new_reqs:
        return True
    batch = runner.input_batch
    for req_id in scheduler_output.num_scheduled_tokens:
        i = batch.req_id_to_index.get(req_id)
        if i is not None and batch.num_computed_tokens_cpu[i] < batch.num_prompt_tokens[i]:
            return True
    return False


def _linear_label(
    self: Any,
    y: Any,
    x: Any,
    a: Any,
    b: Any,
    scale: float,
    output_slices: tuple[int, ...],
    **kwargs: Any,
) -> str:
    """qkv / gate_up by slice count; o vs down by input width (down's is the widest)."""
    if len(output_slices) in SLICES_LABEL:
        return "  lora " + SLICES_LABEL[len(output_slices)]
    return "  lora " + ("down" if x.shape[-1] > y.shape[-1] else "o")


def profile_engine(cfg: dict, seeds: list[int], torch_profile: int) -> dict:
    """Warm an engine up, time ``len(seeds)`` rounds with the timers on."""
    engine = BenchEngine(cfg)
    engine.warm_up()
    TIMERS.reset()
    TIMERS.on = True
    cpu = 0.0
    tokens = 0
    try:
        for seed in seeds:
            r = engine.round(seed)
            cpu += r["cpu_s"]
            tokens += r["output_tokens"]
    finally:
        TIMERS.on = False
    out: dict[str, Any] = {
        "mode": cfg["mode"],
        "round_cpu_s": round(cpu / len(seeds), 3),
        "out_tok_per_cpu_s": round(tokens / cpu, 1),
        "ms_per_step": TIMERS.table(),
    }
    if torch_profile:
        out["torch_ops"] = _torch_ops(engine, seeds[0] + 1000, torch_profile)
    del engine
    return out


def _torch_ops(engine: BenchEngine, seed: int, top: int) -> list[dict]:
    """Self CPU time of the top aten ops over one round (under the profiler's overhead)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.round(seed)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    return [
        {"op": e.key, "calls": e.count, "self_ms": round(e.self_cpu_time_total / 1e3, 1)}
        for e in events
    ]


def main(argv: list[str] | None = None) -> int:
    p = engine_bench.parser()
    p.description = __doc__
    p.add_argument("--mode", default="preft-lora", help="adapter mode profiled beside base")
    p.add_argument(
        "--torch-profile",
        type=int,
        default=0,
        metavar="N",
        help="also list the top N torch ops of one more round (profiler on)",
    )
    p.add_argument(
        "--code",
        metavar="REF",
        help="profile a git ref's services/ and kernels/ (as bench.engine_ab)",
    )
    args = p.parse_args(argv)
    if args.code:
        return _run_at_ref(args, list(sys.argv[1:] if argv is None else argv))
    args.quick = args.quick or args.requests is None
    os.environ.update(
        {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "TQDM_DISABLE": "1",
            "VLLM_USE_V2_MODEL_RUNNER": "0",
            "PREFT_WORKER_PREFILL_RESERVED_SLOTS": "0",  # as bench.engine_bench
            "OMP_NUM_THREADS": str(args.threads),
        }
    )
    w = engine_bench.workload(args)
    model, name = engine_bench.resolve_model(args.model, args.var)
    shape = Shape.of(model)
    common = engine_bench.setup(args, w, model, name, shape)
    import torch

    torch.set_num_threads(args.threads)
    instrument()
    seeds = list(range(w["rounds"]))
    results = []
    for mode in ("base", args.mode):
        cfg = {
            **common,
            "mode": mode,
            "adapters": 0 if mode == "base" else w["counts"][0],
            "max_loras": args.max_loras,
        }
        results.append(profile_engine(cfg, seeds, args.torch_profile))
        print(json.dumps(results[-1], indent=1), flush=True)
    out = args.out or result_path(args.result_dir, f"engine_profile_{name}_{args.mode}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "workload": {k: v for k, v in common.items() if k not in ("model", "adapter_root")},
                "adapters": w["counts"][0],
                "results": results,
                "date": time.strftime("%Y-%m-%d %H:%M"),
            },
            indent=1,
        )
    )
    print(f"wrote {out}")
    return 0


def _run_at_ref(args: argparse.Namespace, argv: list[str]) -> int:
    """Re-run this profile in a child whose ``preft_serve`` / ``preft_kernels`` are the
    ref's (paths made absolute: the child runs from a neutral directory)."""
    import subprocess
    import tempfile

    from bench.engine_ab import import_dir

    i = argv.index("--code")
    rest = argv[:i] + argv[i + 2 :]
    model = Path(args.model)
    if (model / "config.json").exists():
        rest += ["--model", str(model.resolve())]
    out = (
        args.out or result_path(args.result_dir, f"engine_profile_{args.mode}_at_{args.code}.json")
    ).resolve()
    rest += ["--var", str(args.var.resolve()), "--out", str(out)]
    with tempfile.TemporaryDirectory(prefix="preft-profile-") as tmp:
        shim = import_dir(Path(tmp) / "code", args.code)
        env = {**os.environ, "PYTHONPATH": str(shim)}
        return subprocess.run(
            [sys.executable, "-m", "bench.engine_profile", *rest], check=False, env=env, cwd=tmp
        ).returncode


if __name__ == "__main__":
    sys.exit(main())
