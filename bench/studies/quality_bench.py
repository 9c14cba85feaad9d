"""Accuracy vs throughput of PreFT and all-token adapters on synthetic SFT tasks.

For every cell (task x adapter configuration x learning rate x seed): train the adapter
with ``preft train``'s trainer (its serving semantics: PreFT LoRA gated to prompt tokens,
all-token LoRA, DiReFT/LoReFT at prompt positions), record the validation and test loss on
assistant tokens with those semantics, then answer the validation and test questions with
greedy decoding served by the real vLLM engine with the preft plugin (one ``vllm.LLM``
for the whole run, one ``LoRARequest`` per trained adapter) and score the replies.
The learning rate is picked per (task, configuration) on validation loss; the other seeds
run at that rate. Throughput per configuration comes from the engine benchmark's results
(``docs/results/engine_bench*.json``) when present, else "not measured".

Each cell is trained in a fresh process and scored at once, and appended to the JSON as it
finishes; a rerun skips finished cells, so a run cut off anywhere loses at most one cell.
The sweep runs every task x configuration at the first LR before the other LRs, so a
partial run already has a complete table.

    python -m bench.studies.quality_bench --quick        # one task, PreFT vs all-token LoRA r16
    python -m bench.studies.quality_bench                # 3 tasks, 9 configurations, LR sweep
    python -m bench.studies.quality_bench --model DIR --steps 3 --out /tmp/q.json --quick
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.results import RECORDED, ROOT, add_result_dir, result_path
from bench.studies.quality_tasks import Task, make_tasks

DOC = Path(__file__).resolve().parents[2] / "docs" / "quality.md"
DEFAULT_MODEL = Path("var/models/smollm2-135m-instruct")
WORK = Path("var/quality")
TABLE_START, TABLE_END = "<!-- quality-table:start -->", "<!-- quality-table:end -->"


@dataclasses.dataclass(frozen=True)
class Config:
    """One adapter configuration: name, family, mode, rank (and ReFT positions)."""

    name: str
    type: str  # lora | direft | loreft
    mode: str  # prefill | all
    rank: int
    engine_mode: str  # the engine benchmark's mode for its throughput
    positions: str = "prefill"

    def spec(self) -> Any:
        from preft_serve.adapters.format import AdapterMode, AdapterType
        from preft_serve.training.spec import AdapterSpec

        return AdapterSpec(
            AdapterType(self.type), AdapterMode(self.mode), rank=self.rank, positions=self.positions
        )


def lora(mode: str, rank: int) -> Config:
    label = "preft" if mode == "prefill" else "all"
    return Config(
        f"{label}-lora-r{rank}",
        "lora",
        mode,
        rank,
        "preft-lora" if mode == "prefill" else "all-lora",
    )


def reft(kind: str, rank: int) -> Config:
    return Config(f"preft-{kind}-r{rank}", kind, "prefill", rank, f"preft-{kind}")


FULL_CONFIGS = (
    lora("all", 4),
    lora("all", 16),
    lora("prefill", 4),
    lora("prefill", 16),
    lora("prefill", 64),
    reft("direft", 4),
    reft("direft", 16),
    reft("loreft", 4),
    reft("loreft", 16),
)
QUICK_CONFIGS = (lora("prefill", 16), lora("all", 16))
FULL_LRS = (5e-3, 1e-2, 2e-3)  # run in this order: the first is a complete first pass
QUICK_LRS = (5e-3,)
HEADLINE = {"preft-lora-r16", "all-lora-r16", "preft-lora-r64"}  # get the extra seeds


@dataclasses.dataclass(frozen=True)
class Plan:
    tasks: tuple[str, ...]
    configs: tuple[Config, ...]
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]
    steps: int
    batch_size: int


def cell_key(task: str, config: str, lr: float, seed: int, steps: int) -> str:
    return f"{task}/{config}/lr={lr:g}/seed={seed}/steps={steps}"


# -- results file -----------------------------------------------------------------------


def load_results(path: Path) -> dict[str, Any]:
    if path.exists():
        return dict(json.loads(path.read_text()))
    return {"meta": {}, "cells": []}


def save_results(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(path)


# -- training and eval loss -------------------------------------------------------------


@contextlib.contextmanager
def _capture_adapter() -> Iterator[list[Any]]:
    """The trainer keeps its adapter to itself; catch it to score the test split with the
    same weights and semantics (``mean_nll`` over the trained adapter)."""
    from preft_serve.training import trainer

    caught: list[Any] = []
    original = trainer.attach_adapter

    def attach(*args: Any, **kwargs: Any) -> Any:
        caught.append(original(*args, **kwargs))
        return caught[-1]

    trainer.attach_adapter = attach
    try:
        yield caught
    finally:
        trainer.attach_adapter = original


def train_cell(
    model: Path,
    task: Task,
    config: Config,
    lr: float,
    seed: int,
    plan: Plan,
    out: Path,
    say: Any = print,
) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from preft_serve.training.data import load_dataset
    from preft_serve.training.loss import mean_nll
    from preft_serve.training.synthetic import write_jsonl
    from preft_serve.training.trainer import TrainConfig, _batches, pad_id, train

    data = out / "data"
    train_file = write_jsonl((i.record() for i in task.train), data / "train.jsonl")
    val_file = write_jsonl((i.record() for i in task.validation), data / "validation.jsonl")
    test_file = write_jsonl((i.record() for i in task.test), data / "test.jsonl")
    cfg = TrainConfig(
        data=train_file,
        model=model,
        out=out / "adapter",
        adapter=config.spec(),
        validation=val_file,
        max_steps=plan.steps,
        batch_size=min(plan.batch_size, len(task.train)),
        learning_rate=lr,
        warmup_steps=1,
        seed=seed,
        progress=True,
    )
    with _capture_adapter() as caught:
        result = train(cfg, say=lambda line: say(f"    {line}"))
    adapter = caught[0]
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    test = load_dataset(test_file, tokenizer, cfg.max_seq_len, cfg.overlong)
    test_loss = mean_nll(adapter, _batches(test.examples, 8, pad_id(tokenizer), "cpu"))
    return {
        "adapter": str(result.out),
        "train_loss": result.train_loss,
        "val_loss": result.eval_loss,
        "test_loss": test_loss,
        "train_s": result.metrics["wall_seconds"],
    }


# -- the engine -------------------------------------------------------------------------


class QualityEngine:
    """One ``vllm.LLM`` with the preft plugin for every configuration of a run."""

    def __init__(self, model: Path, max_rank: int, max_adapters: int) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from transformers import AutoTokenizer
        from vllm import LLM

        from preft_serve.worker.engine_config import preft_engine_kwargs
        from preft_serve.worker.vllm_compat.engine_args import engine_max_lora_rank

        self.tokenizer = AutoTokenizer.from_pretrained(str(model))
        rank = engine_max_lora_rank(max_rank)
        t0 = time.perf_counter()
        self.llm = LLM(
            model=str(model),
            dtype="float32",
            enforce_eager=True,
            seed=0,
            kv_cache_memory_bytes=256 << 20,
            block_size=32,
            max_model_len=512,
            max_num_seqs=32,
            max_num_batched_tokens=512,
            max_loras=2,
            max_lora_rank=rank,
            max_cpu_loras=max(2, max_adapters),
            **preft_engine_kwargs(),
        )
        self.start_s = round(time.perf_counter() - t0, 1)
        self._next_id = 1

    def prompt_ids(self, question: str) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def replies(self, questions: list[str], adapter: Path | None, max_tokens: int) -> list[Any]:
        """Greedy completions (vLLM ``CompletionOutput``: ``.text``, ``.token_ids``)."""
        from vllm import SamplingParams
        from vllm.lora.request import LoRARequest

        request = None
        if adapter is not None:
            request = LoRARequest(f"q{self._next_id}", self._next_id, str(adapter))
            self._next_id += 1
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        outs = self.llm.generate(
            [{"prompt_token_ids": self.prompt_ids(q)} for q in questions],
            params,
            lora_request=request,
            use_tqdm=False,
        )
        return [o.outputs[0] for o in outs]


def score(engine: QualityEngine, task: Task, adapter: Path | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for split in ("validation", "test"):
        items = getattr(task, split)
        outs = engine.replies([i.question for i in items], adapter, task.max_tokens)
        replies = [o.text for o in outs]
        hits = [task.check(r, i.answer) for r, i in zip(replies, items)]
        out[f"{split}_acc"] = sum(hits) / len(hits)
        out[f"{split}_replies"] = replies
        out[f"{split}_token_ids"] = [list(o.token_ids) for o in outs]
    return out


# -- throughput from the engine benchmark -----------------------------------------------


def measured_throughput(results_dir: Path = RECORDED) -> list[dict[str, Any]]:
    """Every adapter mode's output throughput over its base model's, from every engine
    benchmark result in ``results_dir`` (rows at the run's equal ``max_loras`` only)."""
    rows: list[dict[str, Any]] = []
    for path in sorted(results_dir.glob("engine_bench*.json")):
        data = json.loads(path.read_text())
        meta = data.get("meta", {})
        equal = meta.get("max_loras")
        runs = data.get("runs", [])
        base = next((r for r in runs if r["mode"] == "base"), None)
        for r in runs:
            if (
                base is None
                or r["mode"] == "base"
                or (equal is not None and r.get("max_loras") != equal)
            ):
                continue
            reft = r["mode"] in ("preft-direft", "preft-loreft")
            rows.append(
                {
                    "model": meta.get("model_name", "bench-llama"),
                    "mode": r["mode"],
                    "rank": meta.get("reft_rank", 8) if reft else meta.get("rank", 16),
                    # ReFT positions (runs before the flag existed used f7+l7); None for LoRA
                    "positions": meta.get("reft_positions", "f7+l7") if reft else None,
                    "adapters": r["adapters"],
                    "quick": bool(meta.get("quick")),
                    "started": str(meta.get("started", "")),
                    "x_base": round(
                        r.get("x_base") or r["output_tokens_per_s"] / base["output_tokens_per_s"], 3
                    ),
                    "source": (
                        str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
                    ),
                }
            )
    return rows


def config_throughput(
    config: Config, model_name: str, measured: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The measurement closest to this configuration: its engine mode on the same model at
    the same rank (and, for ReFT, the same prompt positions) if there is one, else the same
    model at another rank or positions, else another model; a full run over a quick one,
    then the most adapters, then the newest run."""
    candidates = [r for r in measured if r["mode"] == config.engine_mode]
    if not candidates:
        return None
    positions = config.positions if config.type != "lora" else None
    return max(
        candidates,
        key=lambda r: (
            r["model"] == model_name,
            r["rank"] == config.rank,
            r.get("positions") == positions,
            not r["quick"],
            r["adapters"],
            r["started"],
        ),
    )


CONFIGS = {c.name: c for c in FULL_CONFIGS + QUICK_CONFIGS}


def attach_throughput(
    rows: list[dict[str, Any]], model_name: str, measured: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each row's ``x_base`` and where it came from, looked up when the report is made
    (so a later engine benchmark run updates the whole table)."""
    for row in rows:
        if row["config"] == "base":
            row.update(x_base=1.0, x_from=None)
            continue
        got = config_throughput(CONFIGS[row["config"]], model_name, measured)
        row.update(x_base=got and got["x_base"], x_from=got)
    return rows


# -- report -----------------------------------------------------------------------------


def summarise(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (task, configuration): the LR picked on validation loss (seed 0), and
    the mean (and spread) over the seeds run at that LR."""
    cells = results["cells"]
    rows = []
    groups: dict[tuple[str, str], list[dict]] = {}
    for c in cells:
        groups.setdefault((c["task"], c["config"]), []).append(c)
    for (task, config), group in groups.items():
        if config == "base":
            c = group[0]
            rows.append(
                {
                    "task": task,
                    "config": "base",
                    "lr": None,
                    "seeds": 0,
                    "test_loss": None,
                    "test_acc": c["test_acc"],
                    "val_acc": c["validation_acc"],
                }
            )
            continue
        seed0 = [c for c in group if c["seed"] == min(x["seed"] for x in group)]
        best = min(seed0, key=lambda c: c["val_loss"] if math.isfinite(c["val_loss"]) else math.inf)
        at_lr = [c for c in group if c["lr"] == best["lr"]]
        losses = [c["test_loss"] for c in at_lr]
        accs = [c["test_acc"] for c in at_lr]
        rows.append(
            {
                "task": task,
                "config": config,
                "lr": best["lr"],
                "seeds": len(at_lr),
                "test_loss": statistics.mean(losses),
                "test_loss_sd": statistics.stdev(losses) if len(losses) > 1 else None,
                "test_acc": statistics.mean(accs),
                "test_acc_sd": statistics.stdev(accs) if len(accs) > 1 else None,
                "val_acc": best["validation_acc"],
                "val_loss": best["val_loss"],
            }
        )
    return rows


def table(rows: list[dict[str, Any]], model_name: str) -> str:
    lines = [
        (
            "| task | configuration | LR (picked on val loss) | seeds | val loss | test loss | "
            "test accuracy | val accuracy | throughput x base |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    sources: set[str] = set()
    for r in rows:
        val = "—" if r.get("val_loss") is None else f"{r['val_loss']:.3f}"
        loss = "—" if r["test_loss"] is None else f"{r['test_loss']:.3f}"
        if r.get("test_loss_sd") is not None:
            loss += f" ± {r['test_loss_sd']:.3f}"
        acc = f"{r['test_acc']:.0%}"
        if r.get("test_acc_sd") is not None:
            acc += f" ± {r['test_acc_sd']:.0%}"
        got = r.get("x_from")
        tput = "not measured" if r["x_base"] is None else f"{r['x_base']:.2f}"
        if got:
            sources.add(got["source"])
            config = CONFIGS[r["config"]]
            differs = [got["model"]] if got["model"] != model_name else []
            if got["rank"] != config.rank:
                differs.append(f"r{got['rank']}")
            if got.get("positions") not in (None, config.positions):
                differs.append(f"positions {got['positions']}")
            if differs:
                tput += f" ({', '.join(differs)})"
        lines.append(
            f"| {r['task']} | {r['config']} | {r['lr'] or '—'} | {r['seeds']} | "
            f"{val} | {loss} | {acc} | {r['val_acc']:.0%} | {tput} |"
        )
    note = (
        "\nThroughput: output tokens/s over the base model's in the same engine-benchmark "
        f"run, at the largest adapter count and equal slots, on {model_name} at the "
        "configuration's rank (ReFT: at its prompt positions) unless the cell names "
        "another model, rank or positions; from "
        + ", ".join(f"`{s}`" for s in sorted(sources))
        + "."
        if sources
        else "\nThroughput: not measured (no docs/results/engine_bench*.json)."
    )
    return "\n".join(lines) + "\n" + note + "\n"


def write_doc(text: str, doc: Path) -> None:
    block = f"{TABLE_START}\n{text}{TABLE_END}"
    body = doc.read_text() if doc.exists() else f"# Quality benchmark\n\n{block}\n"
    if TABLE_START in body and TABLE_END in body:
        head, rest = body.split(TABLE_START, 1)
        body = head + block + rest.split(TABLE_END, 1)[1]
    else:
        body += f"\n{block}\n"
    doc.write_text(body)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """The Pareto picture: one point per configuration (mean over the tasks it ran on)
    at its serving throughput, each task's own value as a faint mark behind it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(12, 4.6))
    by_config: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_config.setdefault(r["config"], []).append(r)
    for i, (config, group) in enumerate(by_config.items()):
        x = group[0]["x_base"] if group[0]["x_base"] is not None else float("nan")
        colour = f"C{i % 10}"
        for ax, key in ((acc_ax, "test_acc"), (loss_ax, "test_loss")):
            values = [r[key] for r in group if r[key] is not None]
            if not values:
                continue
            ax.scatter([x] * len(values), values, color=colour, alpha=0.25, s=14)
            mean = statistics.mean(values)
            ax.scatter([x], [mean], color=colour, s=46, label=config)
            ax.annotate(config, (x, mean), fontsize=7, xytext=(4, 2), textcoords="offset points")
    acc_ax.set(
        xlabel="serving throughput (x base model, engine benchmark)",
        ylabel="test accuracy (greedy, served)",
        title="accuracy vs throughput",
    )
    loss_ax.set(
        xlabel="serving throughput (x base model, engine benchmark)",
        ylabel="test loss (assistant tokens)",
        title="eval loss vs throughput",
    )
    acc_ax.legend(fontsize=7, loc="best")
    fig.suptitle("one point per configuration: mean over tasks (faint: each task)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(
    results: dict[str, Any], model_name: str, out: Path, doc: Path | None, say: Any = print
) -> None:
    """Table (printed, and into ``doc`` between its markers) and plot from the results."""
    rows = attach_throughput(summarise(results), model_name, measured_throughput())
    text = table(rows, model_name)
    say("\n" + text)
    if doc is not None:
        write_doc(text, doc)
    plot(rows, out.with_suffix(".png"))


# -- run --------------------------------------------------------------------------------


def sweep_cells(plan: Plan) -> Iterator[tuple[str, Config, float, int]]:
    """The LR sweep at the first seed, in the order that makes a cut-off run most useful:
    every task x configuration at the first LR of ``plan.lrs`` (a complete table; the
    LoRA configurations, which the paper's SFT findings compare, on every task before the
    ReFT ones), then the other LRs."""
    families = (
        [c for c in plan.configs if c.type == "lora"],
        [c for c in plan.configs if c.type != "lora"],
    )
    for lr in plan.lrs:
        for family in families:
            for task in plan.tasks:
                for config in family:
                    yield task, config, lr, plan.seeds[0]


def seed_cells(plan: Plan, val_loss: dict[str, float]) -> Iterator[tuple[str, Config, float, int]]:
    """The other seeds of the headline configurations (every configuration in a run of
    two), at the LR their sweep picked on validation loss (``val_loss`` by cell key)."""
    for task in plan.tasks:
        for config in plan.configs:
            if config.name not in HEADLINE and len(plan.configs) > 2:
                continue
            sweep = {
                lr: val_loss.get(
                    cell_key(task, config.name, lr, plan.seeds[0], plan.steps), math.inf
                )
                for lr in plan.lrs
            }
            best = min(sweep, key=lambda lr: sweep[lr])
            for seed in plan.seeds[1:]:
                yield task, config, best, seed


def _train_child(
    model: Path,
    task: str,
    config: Config,
    lr: float,
    seed: int,
    plan: Plan,
    out: Path,
    threads: int,
) -> None:
    """A spawned process's whole job: train one cell (its record lands in cell.json).
    It exits when its parent is gone, so a killed run leaves no trainer behind."""
    import threading

    import torch

    parent = os.getppid()

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch_parent, daemon=True).start()
    torch.set_num_threads(threads)
    trained = train_cell(
        model, make_tasks()[task], config, lr, seed, plan, out, lambda line: print(line, flush=True)
    )
    (out / "cell.json").write_text(json.dumps(trained))


def train_isolated(
    model: Path,
    task: str,
    config: Config,
    lr: float,
    seed: int,
    plan: Plan,
    out: Path,
    threads: int,
    say: Any,
) -> dict[str, Any]:
    """Train in a fresh process: the run's in-process vLLM engine pins this process's torch
    to one thread, and a crash or OOM in training must not take the engine down with it."""
    import multiprocessing

    record = out / "cell.json"
    if not record.exists():
        child = multiprocessing.get_context("spawn").Process(
            target=_train_child, args=(model, task, config, lr, seed, plan, out, threads)
        )
        child.start()
        try:
            child.join()
        finally:
            if child.is_alive():  # interrupted: the trainer goes with the run
                child.terminate()
                child.join()
        if child.exitcode != 0 or not record.exists():
            raise RuntimeError(
                f"training {task}/{config.name} lr={lr:g} seed={seed} failed "
                f"(exit code {child.exitcode}); its output is above"
            )
    else:
        say("    adapter already trained, reused")
    return dict(json.loads(record.read_text()))


def run(
    plan: Plan,
    model: Path,
    out: Path,
    work: Path,
    doc: Path | None,
    threads: int | None = None,
    say: Any = print,
) -> dict[str, Any]:
    """Score the base model, then train and score one cell at a time, appending each to
    the results as it finishes, so a run cut off anywhere loses at most one cell."""
    started = time.monotonic()
    tasks = make_tasks()
    results = load_results(out)
    # A resumed study runs in parts (a grid slice, a seed, one LR): the cells say what was
    # run; the meta keeps this run's plan under a name that says so.
    results["meta"].pop("plan", None)
    results["meta"].update(
        {
            "model": str(model),
            "last_run_plan": {
                "tasks": plan.tasks,
                "configs": [c.name for c in plan.configs],
                "lrs": plan.lrs,
                "seeds": plan.seeds,
                "steps": plan.steps,
                "batch_size": plan.batch_size,
            },
            "machine": f"{os.cpu_count()} CPUs",
        }
    )
    done = {c["key"] for c in results["cells"]}
    val_loss = {c["key"]: c["val_loss"] for c in results["cells"] if "val_loss" in c}
    finished_now = 0
    engine: QualityEngine | None = None

    def get_engine() -> QualityEngine:
        nonlocal engine
        if engine is None:
            say("starting the vLLM engine (preft plugin) ...")
            engine = QualityEngine(model, max(c.rank for c in plan.configs), 4)
            say(f"engine ready in {engine.start_s} s")
        return engine

    def finish(cell: dict[str, Any]) -> None:
        nonlocal finished_now
        results["cells"].append(cell)
        done.add(cell["key"])
        finished_now += 1
        results["meta"]["wall_s_total"] = round(
            results["meta"].get("wall_s_total", 0.0) + cell.get("train_s", 0.0) + cell["eval_s"], 1
        )
        save_results(out, results)

    for task in plan.tasks:
        key = cell_key(task, "base", 0, 0, 0)
        if key in done:
            say(f"[skip] {key} (already in {out})")
            continue
        t0 = time.monotonic()
        cell = {
            "key": key,
            "task": task,
            "config": "base",
            "lr": 0,
            "seed": 0,
            **score(get_engine(), tasks[task], None),
            "eval_s": round(time.monotonic() - t0, 1),
        }
        finish(cell)
        say(f"[base] {task}: test acc {cell['test_acc']:.0%}, val acc {cell['validation_acc']:.0%}")

    def run_cells(cells: Iterator[tuple[str, Config, float, int]]) -> None:
        for task, config, lr, seed in cells:
            key = cell_key(task, config.name, lr, seed, plan.steps)
            if key in done:
                say(f"[skip] {key} (already in {out})")
                continue
            say(f"[train] {key}: {plan.steps} steps ({len(done)} cells done) ...")
            cell_dir = work / task / config.name / f"lr{lr:g}-s{seed}-n{plan.steps}"
            record = train_isolated(
                model, task, config, lr, seed, plan, cell_dir, threads or os.cpu_count() or 1, say
            )
            say(
                f"[trained] {key}: train loss {record['train_loss']:.3f}, val loss "
                f"{record['val_loss']:.3f}, test loss {record['test_loss']:.3f} "
                f"({record['train_s']:.0f} s)"
            )
            t0 = time.monotonic()
            scored = score(get_engine(), tasks[task], Path(record["adapter"]))
            cell = {
                "key": key,
                "task": task,
                "config": config.name,
                "type": config.type,
                "mode": config.mode,
                "rank": config.rank,
                "lr": lr,
                "seed": seed,
                "steps": plan.steps,
                **record,
                **scored,
                "eval_s": round(time.monotonic() - t0, 1),
            }
            finish(cell)
            val_loss[key] = record["val_loss"]
            say(
                f"[done] {key}: test loss {cell['test_loss']:.3f}, test acc "
                f"{cell['test_acc']:.0%}, val acc {cell['validation_acc']:.0%} "
                f"(served in {cell['eval_s']:.0f} s)"
            )

    run_cells(sweep_cells(plan))
    run_cells(seed_cells(plan, val_loss))
    results["meta"]["last_run_s"] = round(time.monotonic() - started, 1)
    results["meta"]["last_run_cells"] = finished_now
    save_results(out, results)
    report(results, model.name, out, doc, say)
    say(f"results: {out}, plot: {out.with_suffix('.png')}, wall {time.monotonic() - started:.0f} s")
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="one task (facts), PreFT vs all-token LoRA r16, one LR and seed",
    )
    p.add_argument(
        "--model",
        default=None,
        help=f"model directory (default {DEFAULT_MODEL}); 'tiny-llama' generates the toy model",
    )
    p.add_argument("--tasks", default=None, help="comma list of tasks (default: all; quick: facts)")
    p.add_argument(
        "--configs",
        default=None,
        help="comma list of configurations (default: all nine; quick: two), e.g. "
        "preft-loreft-r4,preft-loreft-r16 to run a part of the grid first",
    )
    p.add_argument(
        "--lrs",
        default=None,
        help="comma list of learning rates (default 5e-3,1e-2,2e-3; quick 5e-3); "
        "cells are keyed by LR, so a partial run's cells count in the full one",
    )
    p.add_argument("--steps", type=int, default=None, help="training steps (quick 16, full 40)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seeds", type=int, default=None, help="seeds for headline cells (full 2)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results JSON (default RESULT_DIR/quality_bench[_quick].json)",
    )
    add_result_dir(p)
    p.add_argument("--work", type=Path, default=WORK, help="where adapters are trained")
    p.add_argument(
        "--report",
        action="store_true",
        help="only rewrite the table and plot from the results JSON (no training)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for training (default: every CPU; 1 beside another benchmark)",
    )
    p.add_argument(
        "--doc",
        type=Path,
        default=DOC,
        help="markdown file whose table block is rewritten ('-' for none)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up (the trainer) on kill
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TQDM_DISABLE", "1")
    model = Path(args.model) if args.model else DEFAULT_MODEL
    if args.model in ("tiny-llama", "tiny-qwen2"):
        from preft_serve.toymodels import make_model

        model = make_model(args.model, Path(tempfile.gettempdir()) / f"quality-{args.model}")
    if not (model / "config.json").exists():
        print(f"error: no model at {model} (make model prepares SmolLM2)", file=sys.stderr)
        return 2
    tasks = (
        tuple(args.tasks.split(","))
        if args.tasks
        else (("facts",) if args.quick else tuple(make_tasks()))
    )
    seeds = args.seeds or (1 if args.quick else 2)
    configs = QUICK_CONFIGS if args.quick else FULL_CONFIGS
    if args.configs:
        wanted = args.configs.split(",")
        unknown = [c for c in wanted if c not in CONFIGS]
        if unknown:
            print(
                f"error: unknown configuration(s) {', '.join(unknown)}; known: "
                f"{', '.join(CONFIGS)}",
                file=sys.stderr,
            )
            return 2
        configs = tuple(CONFIGS[c] for c in wanted)
    lrs = (
        tuple(float(x) for x in args.lrs.split(","))
        if args.lrs
        else (QUICK_LRS if args.quick else FULL_LRS)
    )
    plan = Plan(
        tasks=tasks,
        configs=configs,
        lrs=lrs,
        seeds=tuple(range(seeds)),
        steps=args.steps or (16 if args.quick else 40),
        batch_size=args.batch_size,
    )
    out = args.out or result_path(
        args.result_dir, "quality_bench_quick.json" if args.quick else "quality_bench.json"
    )
    if args.report:
        report(load_results(out), model.name, out, None if str(args.doc) == "-" else args.doc)
        return 0
    run(plan, model, out, args.work, None if str(args.doc) == "-" else args.doc, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
