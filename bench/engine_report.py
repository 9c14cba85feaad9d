"""Engine benchmark results: aggregation, tables, the quick-mode sanity check, the plot.

Free of vLLM so that tests can check it on recorded JSON. The raw data is one record per
timed *round* of one engine (see ``bench.engine_bench``); every group of engines that
ran side by side has its own base-model engine in each round, so every ratio here is taken
within a round (same seconds of the same machine) and then summarised by its median.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.stats import median

MODES = ("base", "stock-lora", "all-lora", "preft-lora", "preft-direft", "preft-loreft")
ADAPTER_MODES = MODES[1:]

SANITY_MARGIN = 0.05
"""How far above the base model an adapter mode may come out before the run is called
noise: adapters only ever add work, so a median ratio over ``1 + SANITY_MARGIN`` means the
measurement, not the engine, is wrong."""
SANITY_MIN_ROUNDS = 3
SANITY_MIN_ROUND_S = 2.0
"""The shortest base-model round that gives a ratio (shorter rounds are mostly noise)."""

Key = tuple[str, int, int]  # (mode, adapters, max_loras)


def key_of(record: dict) -> Key:
    return (record["mode"], int(record["adapters"]), int(record["max_loras"]))


def aggregate(
    rounds: list[dict], engines: list[dict] | None = None, basis: str = "cpu"
) -> list[dict]:
    """One row per (mode, adapters, max_loras): median throughput and the median of its
    per-round ratios to the base engine of the same group and round.

    ``basis`` "cpu" divides output tokens by the engine process's CPU time (the engines run
    one compute thread, so this is the throughput on a core of its own, and a neighbour
    that takes the core for a while does not count), "wall" by elapsed time. Rows carry
    both (``x_base_cpu``, ``x_base_wall``); ``x_base`` and its range use ``basis``."""
    base_by_round: dict[tuple[int, int], dict] = {}
    for r in rounds:
        if r["mode"] == "base":
            base_by_round[(r["group"], r["round"])] = r
    info = {key_of(e): e for e in engines or []}
    by_key: dict[Key, list[dict]] = defaultdict(list)
    for r in rounds:
        by_key[key_of(r)].append(r)

    def rate(r: dict, kind: str) -> float:
        return r["output_tokens"] / (r["cpu_s"] if kind == "cpu" else r["elapsed_s"])

    rows = []
    for key, recs in by_key.items():
        ratios: dict[str, list[float]] = {"cpu": [], "wall": []}
        for r in recs:
            base = base_by_round.get((r["group"], r["round"]))
            if base is None:
                continue
            for kind, values in ratios.items():
                values.append(rate(r, kind) / rate(base, kind))
        row: dict[str, Any] = {
            "mode": key[0],
            "adapters": key[1],
            "max_loras": key[2],
            "rounds": len(recs),
            "output_tokens_per_s": round(median(rate(r, "wall") for r in recs), 2),
            "output_tokens_per_cpu_s": round(median(rate(r, "cpu") for r in recs), 2),
            "total_tokens_per_s": round(median(r["total_tokens_per_s"] for r in recs), 2),
            "round_s": round(median(r["elapsed_s"] for r in recs), 2),
            "round_cpu_s": round(median(r["cpu_s"] for r in recs), 2),
        }
        if ratios[basis]:
            chosen = ratios[basis]
            row.update(
                x_base=round(median(chosen), 4),
                x_base_min=round(min(chosen), 4),
                x_base_max=round(max(chosen), 4),
                x_base_cpu=round(median(ratios["cpu"]), 4),
                x_base_wall=round(median(ratios["wall"]), 4),
            )
        e = info.get(key)
        if e is not None:
            for field in ("slot_bytes", "adapter_host_bytes", "engine_start_s", "warmup_s"):
                if field in e:
                    row[field] = e[field]
        rows.append(row)
    order = {m: i for i, m in enumerate(MODES)}
    rows.sort(
        key=lambda r: (
            r["adapters"] if r["mode"] != "base" else -1,
            r["max_loras"],
            order[r["mode"]],
        )
    )
    return rows


def _find(rows: list[dict], mode: str, adapters: int, max_loras: int) -> dict | None:
    return next((r for r in rows if key_of(r) == (mode, adapters, max_loras)), None)


def best_rows(rows: list[dict], adapters: int) -> dict[str, dict]:
    """Per adapter mode, its row with the highest ratio to base at ``adapters``."""
    best: dict[str, dict] = {}
    for r in rows:
        if r["mode"] == "base" or r["adapters"] != adapters or "x_base" not in r:
            continue
        if r["mode"] not in best or r["x_base"] > best[r["mode"]]["x_base"]:
            best[r["mode"]] = r
    return best


def _ratio(a: dict | None, b: dict | None) -> str:
    if not a or not b or "x_base" not in a or "x_base" not in b:
        return "-"
    return f"{a['x_base'] / b['x_base']:.2f}"


def _xbase(r: dict) -> str:
    if "x_base" not in r:
        return "-"
    return f"**{r['x_base']:.2f}** ({r['x_base_min']:.2f}-{r['x_base_max']:.2f})"


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.1f}"


def equal_table(rows: list[dict], max_loras: int) -> str:
    """Markdown: every mode at every adapter count at the same ``max_loras``."""
    out = [
        (
            "| mode | adapters | max_loras | out tok/CPU-s | x base (range) | x base wall | "
            "x all-lora | x stock best |"
        ),
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    base = [r for r in rows if r["mode"] == "base"]
    if base:
        b = base[0]
        out.append(f"| base | 0 | - | {b['output_tokens_per_cpu_s']:.1f} | 1.00 | 1.00 | - | - |")
    for r in rows:
        if r["mode"] == "base" or r["max_loras"] != max_loras:
            continue
        stock = best_rows(rows, r["adapters"]).get("stock-lora")
        stock = stock if stock and stock["adapters"] == r["adapters"] else None
        out.append(
            f"| {r['mode']} | {r['adapters']} | {r['max_loras']} | "
            f"{r['output_tokens_per_cpu_s']:.1f} | {_xbase(r)} | {r.get('x_base_wall', 0):.2f} | "
            f"{_ratio(r, _find(rows, 'all-lora', r['adapters'], max_loras))} | "
            f"{_ratio(r, stock)} |"
        )
    return "\n".join(out)


def best_table(rows: list[dict], adapters: int) -> str:
    """Markdown: each mode at its own best ``max_loras`` at ``adapters``, with slot memory."""
    best = best_rows(rows, adapters)
    all_best = best.get("all-lora")
    out = [
        (
            "| mode | best max_loras | out tok/CPU-s | x base (range) | x all-lora best | "
            "slot MiB | slots x slot = MiB |"
        ),
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for mode in ADAPTER_MODES:
        r = best.get(mode)
        if r is None:
            continue
        slot = r.get("slot_bytes")
        mem = f"{r['max_loras']} x {_mib(slot)} = {_mib(slot * r['max_loras'])}" if slot else "-"
        out.append(
            f"| {mode} | {r['max_loras']} | {r['output_tokens_per_cpu_s']:.1f} | "
            f"{_xbase(r)} | {_ratio(r, all_best)} | "
            f"{_mib(slot) if slot else '-'} | {mem} |"
        )
    return "\n".join(out)


def sweep_table(rows: list[dict], adapters: int) -> str:
    """Markdown: x base of every mode at every ``max_loras`` measured at ``adapters``."""
    slots = sorted(
        {r["max_loras"] for r in rows if r["adapters"] == adapters and r["mode"] != "base"}
    )
    out = [
        "| mode | " + " | ".join(f"max_loras {m}" for m in slots) + " |",
        "|---|" + "---:|" * len(slots),
    ]
    for mode in ADAPTER_MODES:
        cells = []
        for m in slots:
            r = _find(rows, mode, adapters, m)
            cells.append(f"{r['x_base']:.2f}" if r and "x_base" in r else "-")
        if any(c != "-" for c in cells):
            out.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def targets(rows: list[dict], adapters: int, max_loras: int) -> list[str]:
    """The engine targets at ``adapters``, at equal and at best ``max_loras``."""
    lines = []
    for label, pick in (
        ("equal max_loras", lambda m: _find(rows, m, adapters, max_loras)),
        ("best max_loras", lambda m: best_rows(rows, adapters).get(m)),
    ):
        lora, direft, all_ = pick("preft-lora"), pick("preft-direft"), pick("all-lora")
        if not lora or "x_base" not in lora:
            continue
        lines.append(
            f"{label} (preft-lora at {lora['max_loras']}): "
            f"preft-lora {lora['x_base']:.3f}x base (target >= 0.95), "
            f"{_ratio(lora, all_)}x all-lora (target >= 4), "
            f"preft-direft/preft-lora {_ratio(direft, lora)} (target >= 1)"
        )
    return lines


def sanity(result: dict, margin: float = SANITY_MARGIN) -> list[str]:
    """Problems that make a run's ratios meaningless; empty when the run is sane.

    Checks the shape of the measurement (warm-up excluded, interleaved rounds, enough work
    per round) and its one known answer: no adapter mode beats the base model by more
    than ``margin`` (median of per-round ratios)."""
    meta, rows = result["meta"], result["runs"]
    problems = []
    if not meta.get("warmup_excluded"):
        problems.append("warm-up is not excluded from timing")
    if not meta.get("interleaved"):
        problems.append("rounds are not interleaved")
    base = [r for r in rows if r["mode"] == "base"]
    if not base:
        return [*problems, "no base-model run"]
    if base[0]["round_cpu_s"] < SANITY_MIN_ROUND_S:
        problems.append(
            f"base rounds take {base[0]['round_cpu_s']:.2f} CPU-s "
            f"(< {SANITY_MIN_ROUND_S} s): too little work per round"
        )
    for r in rows:
        if r["mode"] == "base":
            continue
        label = f"{r['mode']}@{r['adapters']}a/max_loras={r['max_loras']}"
        if r["rounds"] < SANITY_MIN_ROUNDS:
            problems.append(f"{label}: {r['rounds']} rounds (< {SANITY_MIN_ROUNDS})")
        if "x_base" not in r:
            problems.append(f"{label}: no base round to compare with")
        elif r["x_base"] > 1 + margin:
            problems.append(
                f"{label}: {r['x_base']:.3f}x base (> {1 + margin:.2f}): "
                "an adapter mode cannot beat the base model; noise"
            )
    return problems


def plot(rows: list[dict], path: Path, max_loras: int, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = max((r["adapters"] for r in rows), default=0)
    sweep = len({r["max_loras"] for r in rows if r["adapters"] == top}) > 1
    fig, axes = plt.subplots(1, 2 if sweep else 1, figsize=(12 if sweep else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    for mode in ADAPTER_MODES:
        pts = sorted(
            (r["adapters"], r["x_base"])
            for r in rows
            if r["mode"] == mode and r["max_loras"] == max_loras and "x_base" in r
        )
        if pts:
            ax.plot(*zip(*pts), marker="o", label=mode)
    for mode, r in best_rows(rows, top).items():
        if r["max_loras"] != max_loras:
            ax.scatter(
                [top],
                [r["x_base"]],
                marker="*",
                s=120,
                zorder=5,
                label=f"{mode} best (max_loras={r['max_loras']})",
            )
    ax.axhline(1.0, color="gray", linestyle="--", label="base model")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("distinct adapters")
    ax.set_ylabel("throughput / base model (median of rounds)")
    ax.set_title(f"{title}: max_loras={max_loras}")
    ax.legend(fontsize=7)
    if sweep:
        ax = axes[0][1]
        for mode in ADAPTER_MODES:
            pts = sorted(
                (r["max_loras"], r["x_base"])
                for r in rows
                if r["mode"] == mode and r["adapters"] == top and "x_base" in r
            )
            if pts:
                ax.plot(*zip(*pts), marker="o", label=mode)
        ax.axhline(1.0, color="gray", linestyle="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max_loras")
        ax.set_title(f"{top} adapters: max_loras sweep")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(result: dict) -> str:
    """The text the benchmark prints (and that the docs quote)."""
    meta, rows = result["meta"], result["runs"]
    top = max(r["adapters"] for r in rows)
    parts = [
        (
            f"model {meta['model_name']}, {meta['workload']['requests']} requests of "
            f"{meta['workload']['prompt_len']}+{meta['workload']['output_len']} tokens, "
            f"{meta['rounds']} interleaved rounds, ratios in {meta.get('basis', 'cpu')} time"
        ),
        "",
        f"Equal max_loras ({meta['max_loras']}):",
        equal_table(rows, meta["max_loras"]),
    ]
    if len({r["max_loras"] for r in rows if r["adapters"] == top}) > 1:
        parts += [
            "",
            f"Best max_loras at {top} adapters:",
            best_table(rows, top),
            "",
            f"x base by max_loras at {top} adapters:",
            sweep_table(rows, top),
        ]
    parts += ["", *targets(rows, top, meta["max_loras"])]
    return "\n".join(parts)
