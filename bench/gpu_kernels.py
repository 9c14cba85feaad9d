"""GPU kernel check and timing: Triton ReFT vs the torch grouped path, plus a LoRA baseline.

One prepared run for a lent H200 (CUDA torch + triton, no vLLM), well under 5 minutes:

1. correctness of ``reft_triton`` against ``grouped_reft`` in float64 (every row), the
   row-by-row ``reft_reference`` (a sample of rows), and ``grouped_reft`` in the same dtype;
   rows in no group must stay bit-identical;
2. time per call (CUDA events, warm-up, median) of ``reft_triton`` vs ``grouped_reft`` for
   Qwen2.5-0.5B / Llama-3.1-8B / Llama-3.1-70B hidden sizes, ranks 4-32, 1-512 adapters with
   128-token prompts each (plus a decode-like, an interleaved and a float32 case per model);
3. ``grouped_lora_linear`` (torch) for rank-16 LoRA on q/k/v/o, as a baseline per layer;
4. a small block-size sweep of the Triton kernel.

Writes ``gpu_kernels.json`` and ``gpu_kernels.md`` to ``--out`` after each section (a
timeout keeps what was done) and prints the tables. Exits 1 if any check failed.

    python -m bench.gpu_kernels --out DIR            # CUDA
    TRITON_INTERPRET=1 python -m bench.gpu_kernels --smoke --out /tmp/gk   # CPU, tiny
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton

from bench.kernel_import import CUDA
from bench.results import add_result_dir, result_path
from preft_kernels.lora_grouped import AdapterGroups, grouped_lora_linear
from preft_kernels.reft import ReftGroup, grouped_reft, reft_reference
from preft_kernels.reft_triton import ReftTritonMeta, reft_triton


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    hidden: int
    q: int  # q_proj / o_proj width
    kv: int  # k_proj / v_proj width (GQA)


MODELS = [
    Model("qwen2.5-0.5b", 896, 896, 128),
    Model("llama-3.1-8b", 4096, 4096, 1024),
    Model("llama-3.1-70b", 8192, 8192, 1024),
]
SMOKE_MODELS = [Model("tiny", 64, 64, 16)]


@dataclasses.dataclass(frozen=True)
class Case:
    model: Model
    rank: int
    adapters: int
    tokens: int  # rows per adapter (prompt length; 1 = decode-like)
    dtype: torch.dtype
    layout: str  # "segments": one request's rows adjacent; "interleaved": rows shuffled


class Timer:
    """Median per-call time: CUDA events on GPU, perf_counter on CPU (smoke only)."""

    def __init__(self, device: torch.device, target_s: float, max_reps: int) -> None:
        self.device, self.target_s, self.max_reps = device, target_s, max_reps

    def _once(self, fn: Callable[[], object]) -> float:
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def median_ms(self, fn: Callable[[], object], warmup: int = 3) -> tuple[float, int]:
        for _ in range(warmup):
            fn()
        first = self._once(fn)
        reps = int(min(self.max_reps, max(5, self.target_s * 1e3 / max(first, 1e-3))))
        return statistics.median(self._once(fn) for _ in range(reps)), reps

    def graph_median_ms(self, fn: Callable[[], object]) -> float:
        """Device time alone: one call captured in a CUDA graph, replays timed (nan on CPU)."""
        if self.device.type != "cuda":
            return float("nan")
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            ms, _ = self.median_ms(graph.replay)
            del graph
            return ms
        except RuntimeError as exc:  # a path that cannot be captured: report, don't abort
            print(f"graph capture failed: {exc}", flush=True)
            return float("nan")


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    want = want.double()
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-30))


def copy_bandwidth(device: torch.device, timer: Timer) -> float:
    """Device-to-device copy, bytes read + written per second: the memory ceiling."""
    numel = (1 << 28) if device.type == "cuda" else (1 << 16)
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    ms, _ = timer.median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def reft_case(
    case: Case, device: torch.device, timer: Timer, gen: torch.Generator, bandwidth: float
) -> dict[str, Any]:
    d, r, k = case.model.hidden, case.rank, case.adapters
    base_rows = max(1, case.tokens // 4)  # base-model requests in the same batch
    n = k * case.tokens + base_rows
    idx = np.r_[np.repeat(np.arange(k), case.tokens), np.full(base_rows, -1)]
    if case.layout == "interleaved":
        idx = idx[np.random.default_rng(k * case.tokens + r).permutation(n)]
    groups_host, groups_dev = [], []
    for a in range(k):
        rows = np.flatnonzero(idx == a)
        if rows[-1] - rows[0] + 1 == rows.size:
            groups_host.append(ReftGroup(slice(int(rows[0]), int(rows[-1]) + 1), a))
            groups_dev.append(groups_host[-1])
        else:
            groups_host.append(ReftGroup(torch.from_numpy(rows), a))
            groups_dev.append(ReftGroup(torch.from_numpy(rows).to(device), a))

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device=device, generator=gen) * scale).to(case.dtype)

    proj_in, bias = randn(k, r, d, scale=d**-0.5), randn(k, r)
    proj_out = randn(k, r, d, scale=r**-0.5)
    h, before = randn(n, d), randn(n, d)

    t0 = time.perf_counter()
    meta = ReftTritonMeta.from_groups(groups_host, device, num_rows=n)
    meta_ms = (time.perf_counter() - t0) * 1e3

    # Correctness (fresh inputs per case; `before` poisons every row with random values).
    out = before.clone()
    reft_triton(out, h, *meta.args(), proj_in, bias, proj_out, max_group_rows=meta.max_group_rows)
    ref = before.double()
    grouped_reft(ref, h.double(), groups_dev, proj_in.double(), bias.double(), proj_out.double())
    same_dtype = before.clone()
    grouped_reft(same_dtype, h, groups_dev, proj_in, bias, proj_out)
    sample = np.random.default_rng(n).choice(
        np.flatnonzero(idx >= 0), size=min(32, k * case.tokens), replace=False
    )
    sample_t = torch.from_numpy(sample).to(device)
    row_ref = reft_reference(h[sample_t], idx[sample].tolist(), proj_in, bias, proj_out)
    untouched = torch.from_numpy(idx < 0).to(device)
    err = rel_err(out.double() - before.double(), ref - before.double())
    err_rows = rel_err(out[sample_t].double() - before[sample_t].double(), row_ref)
    err_torch = rel_err(same_dtype.double() - before.double(), ref - before.double())
    tol = 1e-4 if case.dtype == torch.float32 else 2e-2  # IEEE fp32 vs bf16 rounding
    ok = (
        err < tol
        and err_rows < tol
        and bool(torch.equal(out[untouched], before[untouched]))
        and bool(torch.isfinite(out).all())
    )
    del ref, same_dtype

    def run_triton() -> None:
        reft_triton(
            out, h, *meta.args(), proj_in, bias, proj_out, max_group_rows=meta.max_group_rows
        )

    def run_torch() -> None:
        grouped_reft(out, h, groups_dev, proj_in, bias, proj_out)

    triton_ms, triton_reps = timer.median_ms(run_triton)
    torch_ms, torch_reps = timer.median_ms(run_torch)
    triton_dev_ms = timer.graph_median_ms(run_triton)
    torch_dev_ms = timer.graph_median_ms(run_torch)
    kernel_ms = triton_ms if np.isnan(triton_dev_ms) else triton_dev_ms
    elem = h.element_size()
    moved = k * case.tokens * d * 3 * elem + k * (2 * r * d + r) * elem  # h, out r+w, weights
    return {
        "model": case.model.name,
        "d": d,
        "rank": r,
        "adapters": k,
        "tokens": case.tokens,
        "rows": n,
        "dtype": str(case.dtype).removeprefix("torch."),
        "layout": case.layout,
        "triton_ms": triton_ms,
        "torch_ms": torch_ms,
        "speedup": torch_ms / triton_ms,
        "triton_dev_ms": triton_dev_ms,
        "torch_dev_ms": torch_dev_ms,
        "dev_speedup": torch_dev_ms / triton_dev_ms,
        "triton_reps": triton_reps,
        "torch_reps": torch_reps,
        "meta_build_ms": meta_ms,
        "min_bytes": moved,
        "triton_gbps": moved / (kernel_ms * 1e-3) / 1e9,
        "frac_copy_bw": moved / (kernel_ms * 1e-3) / bandwidth,
        "err_vs_f64": err,
        "err_rows_vs_reft_reference": err_rows,
        "torch_err_vs_f64": err_torch,
        "tol": tol,
        "ok": ok,
    }


def lora_case(
    model: Model,
    adapters: int,
    tokens: int,
    device: torch.device,
    timer: Timer,
    gen: torch.Generator,
) -> dict[str, Any]:
    """Rank-16 LoRA on q,k,v (fused slices) and o, torch grouped path, bf16."""
    rank, dt = 16, torch.bfloat16 if device.type == "cuda" else torch.float32
    n = adapters * tokens

    def randn(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, device=device, generator=gen) * 0.05).to(dt)

    qkv = (model.q, model.kv, model.kv)
    a_qkv = [randn(adapters, 1, rank, model.hidden) for _ in qkv]
    b_qkv = [randn(adapters, 1, o, rank) for o in qkv]
    a_o, b_o = [randn(adapters, 1, rank, model.q)], [randn(adapters, 1, model.hidden, rank)]
    groups = AdapterGroups.from_slots(np.repeat(np.arange(adapters), tokens))
    x, y_qkv = randn(n, model.hidden), randn(n, sum(qkv))
    x_o, y_o = randn(n, model.q), randn(n, model.hidden)
    qkv_ms, _ = timer.median_ms(
        lambda: grouped_lora_linear(y_qkv, x, a_qkv, b_qkv, groups, 1.0, qkv)
    )
    o_ms, _ = timer.median_ms(
        lambda: grouped_lora_linear(y_o, x_o, a_o, b_o, groups, 1.0, (model.hidden,))
    )
    return {
        "model": model.name,
        "adapters": adapters,
        "tokens": tokens,
        "rows": n,
        "dtype": str(dt).removeprefix("torch."),
        "qkv_ms": qkv_ms,
        "o_ms": o_ms,
        "layer_ms": qkv_ms + o_ms,
    }


def sweep_case(
    d: int,
    r: int,
    adapters: int,
    tokens: int,
    configs: list[tuple[int, int, int]],
    device: torch.device,
    timer: Timer,
    gen: torch.Generator,
) -> list[dict[str, Any]]:
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    n = adapters * tokens
    proj_in = (torch.randn(adapters, r, d, device=device, generator=gen) * d**-0.5).to(dt)
    bias = torch.randn(adapters, r, device=device, generator=gen).to(dt)
    proj_out = (torch.randn(adapters, r, d, device=device, generator=gen) * r**-0.5).to(dt)
    h = torch.randn(n, d, device=device, generator=gen).to(dt)
    out = h.clone()
    meta = ReftTritonMeta.from_row_index(np.repeat(np.arange(adapters), tokens), device)
    rows = []
    for block_m, block_d, warps in configs:
        ms, _ = timer.median_ms(
            functools.partial(
                reft_triton,
                out,
                h,
                *meta.args(),
                proj_in,
                bias,
                proj_out,
                max_group_rows=meta.max_group_rows,
                block_m=block_m,
                block_d=block_d,
                num_warps=warps,
            )
        )
        rows.append(
            {
                "d": d,
                "rank": r,
                "adapters": adapters,
                "tokens": tokens,
                "block_m": block_m,
                "block_d": block_d,
                "num_warps": warps,
                "triton_ms": ms,
            }
        )
    return rows


def table(rows: list[dict[str, Any]], cols: list[tuple[str, str, str]]) -> str:
    """Markdown table; cols are (header, key, format spec)."""
    lines = ["| " + " | ".join(c[0] for c in cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(format(row[k], f) for _, k, f in cols) + " |")
    return "\n".join(lines)


REFT_COLS = [
    ("model", "model", ""),
    ("r", "rank", "d"),
    ("adapters", "adapters", "d"),
    ("tok", "tokens", "d"),
    ("dtype", "dtype", ""),
    ("layout", "layout", ""),
    ("triton µs", "triton_ms", ".1f"),
    ("torch µs", "torch_ms", ".1f"),
    ("speedup", "speedup", ".1f"),
    ("triton dev µs", "triton_dev_ms", ".1f"),
    ("torch dev µs", "torch_dev_ms", ".1f"),
    ("dev speedup", "dev_speedup", ".1f"),
    ("GB/s", "triton_gbps", ".0f"),
    ("of copy BW", "frac_copy_bw", ".0%"),
    ("meta µs", "meta_build_ms", ".0f"),
    ("err f64", "err_vs_f64", ".1e"),
    ("torch err", "torch_err_vs_f64", ".1e"),
    ("ok", "ok", ""),
]
LORA_COLS = [
    ("model", "model", ""),
    ("adapters", "adapters", "d"),
    ("rows", "rows", "d"),
    ("dtype", "dtype", ""),
    ("qkv µs", "qkv_ms", ".1f"),
    ("o µs", "o_ms", ".1f"),
    ("q+k+v+o µs", "layer_ms", ".1f"),
    ("ReFT r16 triton µs", "reft_r16_ms", ".1f"),
]
SWEEP_COLS = [
    ("d", "d", "d"),
    ("r", "rank", "d"),
    ("adapters", "adapters", "d"),
    ("tok", "tokens", "d"),
    ("block_m", "block_m", "d"),
    ("block_d", "block_d", "d"),
    ("warps", "num_warps", "d"),
    ("triton µs", "triton_ms", ".1f"),
]


def as_us(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table copies with *_ms columns in microseconds (the headers say µs)."""
    return [
        {k: (v * 1e3 if k.endswith("_ms") and isinstance(v, float) else v) for k, v in row.items()}
        for row in rows
    ]


def write(out_dir: Path, report: dict[str, Any]) -> str:
    env = report["env"]
    md = [
        f"# GPU kernels: {env['device_name']}",
        (
            f"torch {env['torch']}, triton {env['triton']}, copy bandwidth "
            f"{env['copy_gbps']:.0f} GB/s (read+write). 'µs' columns: median per call, timed "
            "around the host call (launch overhead included; CUDA events on GPU); 'dev µs': "
            "one call captured in a CUDA graph, median replay (device time). GB/s: fewest "
            "bytes (h read, out read+write, weights) over device time."
        ),
        "",
        "## ReFT: reft_triton vs grouped_reft (torch)",
        table(as_us(report["reft"]), REFT_COLS),
    ]
    if report["lora"]:
        md += [
            "",
            "## LoRA rank 16, grouped_lora_linear (torch), per layer",
            table(as_us(report["lora"]), LORA_COLS),
        ]
    if report["sweep"]:
        md += ["", "## reft_triton block sizes", table(as_us(report["sweep"]), SWEEP_COLS)]
    if report["skipped"]:
        md += ["", f"Skipped (time budget): {', '.join(report['skipped'])}"]
    if report["errors"]:
        md += ["", "Errors:", *(f"- {e}" for e in report["errors"])]
    text = "\n".join(md) + "\n"
    (out_dir / "gpu_kernels.json").write_text(json.dumps(report, indent=1, default=str))
    (out_dir / "gpu_kernels.md").write_text(text)
    return text


def plan(
    smoke: bool,
) -> tuple[list[Case], list[tuple[Model, int, int]], list[tuple[int, int, int, int]]]:
    """(ReFT cases, LoRA cases, sweep shapes)."""
    if smoke:
        m = SMOKE_MODELS[0]
        cases = [Case(m, r, a, 4, torch.float32, "segments") for r in (4, 16) for a in (1, 3)]
        cases += [
            Case(m, 12, 3, 1, torch.float32, "segments"),
            Case(m, 16, 3, 4, torch.bfloat16, "interleaved"),
        ]
        return cases, [(m, a, 4) for a in (1, 3)], [(64, 16, 3, 4)]
    cases = [
        Case(m, r, a, 128, torch.bfloat16, "segments")
        for m in MODELS
        for r in (4, 8, 16, 32)
        for a in (1, 8, 64, 512)
    ]
    for m in MODELS:
        cases += [
            Case(m, 16, 512, 1, torch.bfloat16, "segments"),  # decode-like: 1 row each
            Case(m, 16, 64, 128, torch.bfloat16, "interleaved"),
            Case(m, 16, 8, 128, torch.float32, "segments"),
        ]
    lora = [(m, a, 128) for m in MODELS for a in (1, 8, 64, 512)]
    return cases, lora, [(4096, 16, 64, 128), (8192, 32, 512, 128)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, help="folder for the report (default RESULT_DIR/gpu_kernels)"
    )
    add_result_dir(parser)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes; CPU interpreter ok")
    parser.add_argument(
        "--budget-s", type=float, default=210.0, help="skip remaining cases after this many seconds"
    )
    args = parser.parse_args(argv)
    args.out = args.out or result_path(args.result_dir, "gpu_kernels")
    if not CUDA and not args.smoke:
        parser.error("no CUDA device: run with --smoke (TRITON_INTERPRET=1) on CPU")
    device = torch.device("cuda" if CUDA else "cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    timer = Timer(device, target_s=0.05 if args.smoke else 0.25, max_reps=3 if args.smoke else 200)
    gen = torch.Generator(device=device).manual_seed(0)
    cases, lora_cases, sweeps = plan(args.smoke)
    bw = copy_bandwidth(device, timer)
    report: dict[str, Any] = {
        "env": {
            "device_name": torch.cuda.get_device_name() if CUDA else "cpu (interpreter)",
            "torch": torch.__version__,
            "triton": triton.__version__,
            "copy_gbps": bw / 1e9,
            "smoke": args.smoke,
        },
        "reft": [],
        "lora": [],
        "sweep": [],
        "skipped": [],
        "errors": [],
    }

    def over_budget(label: str) -> bool:
        if time.monotonic() - started > args.budget_s:
            report["skipped"].append(label)
            return True
        return False

    def guarded(label: str, fn: Callable[[], Any]) -> Any:
        """One case's failure (a compile error, out of memory) is recorded, not fatal."""
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - report every failure, keep measuring
            if not report["errors"]:
                traceback.print_exc()
            report["errors"].append(f"{label}: {exc!r}"[:500])
            print(label, "ERROR", repr(exc)[:200], flush=True)
            return None

    for case in cases:
        label = (
            f"reft {case.model.name} r{case.rank} a{case.adapters}x{case.tokens} "
            f"{case.layout} {case.dtype}"
        )
        if not over_budget(label):
            row = guarded(label, functools.partial(reft_case, case, device, timer, gen, bw))
            if row is not None:
                report["reft"].append(row)
                print(label, "ok" if row["ok"] else "FAILED", flush=True)
    write(args.out, report)
    reft16 = {
        (r["model"], r["adapters"], r["tokens"], r["dtype"]): r["triton_ms"]
        for r in report["reft"]
        if r["rank"] == 16 and r["layout"] == "segments"
    }
    for model, adapters, tokens in lora_cases:
        label = f"lora {model.name} a{adapters}"
        if not over_budget(label):
            row = guarded(
                label, functools.partial(lora_case, model, adapters, tokens, device, timer, gen)
            )
            if row is None:
                continue
            row["reft_r16_ms"] = reft16.get(
                (model.name, adapters, tokens, row["dtype"]), float("nan")
            )
            report["lora"].append(row)
    write(args.out, report)
    configs = (
        [(16, 64, 4), (32, 128, 4)]
        if args.smoke
        else [
            (32, 128, 4),
            (64, 64, 4),
            (64, 128, 4),
            (64, 128, 8),
            (128, 64, 4),
            (128, 128, 8),
            (64, 256, 8),
        ]
    )
    for d, r, adapters, tokens in sweeps:
        label = f"sweep d{d} r{r} a{adapters}"
        if not over_budget(label):
            report["sweep"] += (
                guarded(
                    label,
                    functools.partial(
                        sweep_case, d, r, adapters, tokens, configs, device, timer, gen
                    ),
                )
                or []
            )
    report["env"]["wall_s"] = time.monotonic() - started
    print(write(args.out, report))
    failed = [r for r in report["reft"] if not r["ok"]]
    print(
        f"{len(report['reft']) - len(failed)}/{len(report['reft'])} ReFT checks passed, "
        f"{len(report['errors'])} errors; {report['env']['wall_s']:.0f} s"
    )
    return 1 if failed or report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
