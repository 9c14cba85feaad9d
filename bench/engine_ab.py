"""Before/after of an engine change, side by side: the plugin and kernels of a git ref
against those of the working tree, in one run, on the same workload.

    python -m bench.engine_ab --before HEAD~2 --modes preft-lora all-lora \\
        --adapters 512 --max-loras 8 [any engine_bench workload option]

Three hosts stay alive together: the base model, the modes on today's code, the modes on
``--before``'s ``services/`` and ``kernels/`` (extracted with ``git archive`` and put first
on ``PYTHONPATH``, ahead of the editable install). Rounds interleave all of them as
``bench.engine_bench`` does; each mode's row is the median per-round ratio to base,
before and after, and after/before.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import engine_bench
from bench.engine_bench import Host, Run, Shape
from bench.results import result_path

BENCH = Path(__file__).resolve().parent


def import_dir(into: Path, ref: str | None) -> Path:
    """A directory for ``PYTHONPATH`` with ``bench`` (today's) and, for a
    git ``ref``, that ref's ``preft_serve`` and ``preft_kernels``: ``services/preft_serve`` and
    ``kernels/preft_kernels``, or ``services`` and ``kernels`` themselves at a ref whose
    folders are the packages, so that any ref can be compared.

    The hosts run from a neutral working directory: from the repository root, the
    ``kernels`` folder itself would be importable as a top-level ``kernels`` package
    (transformers probes for one) and would import today's ``preft_kernels``."""
    shim = into / "shim"
    shim.mkdir(parents=True)
    (shim / "bench").symlink_to(BENCH)
    if ref is not None:
        src = into / "src"
        src.mkdir()
        archive = subprocess.run(
            ["git", "archive", ref, "services", "kernels"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        for package, folder in (("preft_serve", "services"), ("preft_kernels", "kernels")):
            nested = src / folder / package
            (shim / package).symlink_to(nested if nested.is_dir() else src / folder)
    return shim


def summarise(raw: list[dict], basis: str) -> list[dict]:
    def rate(r: dict) -> float:
        return r["output_tokens"] / (r["cpu_s"] if basis == "cpu" else r["elapsed_s"])

    base = {r["round"]: rate(r) for r in raw if r["variant"] == "base"}
    rows = []
    for mode in dict.fromkeys(r["mode"] for r in raw if r["variant"] != "base"):
        per = {
            v: {
                r["round"]: rate(r) / base[r["round"]]
                for r in raw
                if r["mode"] == mode and r["variant"] == v
            }
            for v in ("before", "after")
        }
        gain = [per["after"][i] / per["before"][i] for i in per["after"] if i in per["before"]]
        rows.append(
            {
                "mode": mode,
                "x_base_before": round(statistics.median(per["before"].values()), 4),
                "x_base_after": round(statistics.median(per["after"].values()), 4),
                "after_over_before": round(statistics.median(gain), 4),
                "after_over_before_range": [round(min(gain), 4), round(max(gain), 4)],
            }
        )
    return rows


def _block(
    block: int,
    rounds: int,
    runs: list[Run],
    common: dict,
    log_dir: Path,
    tmp: Path,
    now: dict[str, str],
    then: dict[str, str],
    max_loras: int,
) -> list[dict]:
    """One block: fresh base / after / before processes (started in alternating order per
    block), ``rounds`` interleaved rounds; round numbers are unique across blocks."""
    order = ["base", "after", "before"] if block % 2 == 0 else ["base", "before", "after"]
    specs = {
        "base": ([Run("base", 0, max_loras)], now),
        "after": (runs, now),
        "before": (runs, then),
    }
    hosts = {
        v: Host(specs[v][0], common, log_dir / f"{v}{block}.log", env=specs[v][1], cwd=tmp)
        for v in order
    }
    try:
        members = []
        for variant, h in hosts.items():
            for i, info in enumerate(h.ready()):
                members.append((variant, h, i))
                print(
                    f"  ready {variant} {h.runs[i].label}: warm-up {info['warmup_s']} s", flush=True
                )
        raw = engine_bench.interleaved_rounds(
            [
                (h, i, f"{variant}/{h.runs[i].mode}", {"variant": variant, "block": block})
                for variant, h, i in members
            ],
            rounds,
        )
    finally:
        for h in hosts.values():
            h.close()
    for r in raw:
        r["round"] += block * rounds
    return raw


def main(argv: list[str] | None = None) -> int:
    p = engine_bench.parser()
    p.description = __doc__
    p.add_argument("--before", required=True, help="git ref of the code to compare with")
    p.add_argument(
        "--blocks",
        type=int,
        default=1,
        help="repeat with fresh engine processes (a process can run a few to "
        "~12%% faster or slower than another for its whole life on a shared "
        "machine; more blocks turn that bias into visible spread)",
    )
    args = p.parse_args(argv)
    w = engine_bench.workload(args)
    w["counts"] = w["counts"][:1]
    model, name = engine_bench.resolve_model(args.model, args.var)
    shape = Shape.of(model)
    common = engine_bench.setup(args, w, model, name, shape)
    common["model"] = str(Path(common["model"]).resolve())
    common["adapter_root"] = str(Path(common["adapter_root"]).resolve())
    modes = [m for m in args.modes if m != "stock-lora"]
    runs = [Run(m, w["counts"][0], args.max_loras) for m in modes]
    log_dir = (args.var / "logs" / f"{name}-ab").resolve()
    out = args.out or result_path(args.result_dir, f"engine_ab_{name}.json")
    raw: list[dict] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="preft-ab-") as tmp:
        now = {"PYTHONPATH": str(import_dir(Path(tmp) / "now", None))}
        then = {"PYTHONPATH": str(import_dir(Path(tmp) / "before", args.before))}
        for block in range(args.blocks):
            if args.blocks > 1:
                print(f"block {block + 1}/{args.blocks}: fresh engine processes", flush=True)
            raw += _block(
                block, w["rounds"], runs, common, log_dir, Path(tmp), now, then, args.max_loras
            )
    rows = summarise(raw, args.basis)
    if args.blocks > 1:  # each block's own after/before: the spread between processes
        for row in rows:
            row["after_over_before_by_block"] = [
                next(
                    r["after_over_before"]
                    for r in summarise([x for x in raw if x["block"] == b], args.basis)
                    if r["mode"] == row["mode"]
                )
                for b in range(args.blocks)
            ]
    for r in rows:
        low, high = r["after_over_before_range"]
        print(
            f"{r['mode']:<13} before {r['x_base_before']:.3f}x base, after "
            f"{r['x_base_after']:.3f}x base: after/before {r['after_over_before']:.3f} "
            f"(rounds {low:.3f}-{high:.3f})"
            + (
                f"; by block {r['after_over_before_by_block']}"
                if "after_over_before_by_block" in r
                else ""
            )
        )
    meta = {
        "before": args.before,
        "after": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True
        ).stdout.strip()
        + " + working tree",
        "model": str(model),
        "basis": args.basis,
        "workload": {k: v for k, v in common.items() if k not in ("model", "adapter_root")},
        "adapters": w["counts"][0],
        "rounds": w["rounds"],
        "blocks": args.blocks,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "wall_s": round(time.perf_counter() - t0),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows, "rounds": raw}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
