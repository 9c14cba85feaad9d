"""The quality benchmark's quick path end to end on the toy model (``--model tiny-llama``).

Accuracy is ~0 on a random model; what is checked is the structure of the results, that
losses are finite, that the trained adapters really went through the engine (PreFT replies
differ from the base model's, and one served reply equals the HF oracle's prefill-only
greedy tokens), that a rerun skips finished cells, and the task data themselves.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.studies import quality_bench
from bench.studies.quality_tasks import make_tasks

ROOT = Path(__file__).resolve().parents[2]


def run_quick(tmp: Path) -> str:
    cmd = [
        sys.executable,
        "-m",
        "bench.studies.quality_bench",
        "--quick",
        "--model",
        "tiny-llama",
        "--steps",
        "4",
        "--out",
        str(tmp / "q.json"),
        "--work",
        str(tmp / "work"),
        "--doc",
        str(tmp / "quality.md"),
    ]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TQDM_DISABLE": "1"}
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("quality")
    stdout = run_quick(tmp)
    return tmp, stdout, json.loads((tmp / "q.json").read_text())


def test_quick_run_records_every_cell_with_finite_losses(quick: tuple) -> None:
    tmp, stdout, results = quick
    cells = {c["config"]: c for c in results["cells"]}
    assert set(cells) == {"base", "preft-lora-r16", "all-lora-r16"}
    for name in ("preft-lora-r16", "all-lora-r16"):
        c = cells[name]
        assert c["task"] == "facts" and c["steps"] == 4 and c["rank"] == 16
        for loss in ("train_loss", "val_loss", "test_loss"):
            assert math.isfinite(c[loss]) and c[loss] > 0
        assert 0.0 <= c["test_acc"] <= 1.0
        assert len(c["test_replies"]) == len(make_tasks()["facts"].test)
    assert cells["preft-lora-r16"]["mode"] == "prefill"
    assert cells["all-lora-r16"]["mode"] == "all"
    assert "[done] facts/preft-lora-r16" in stdout and "| facts | all-lora-r16 |" in stdout
    doc = (tmp / "quality.md").read_text()
    assert quality_bench.TABLE_START in doc and "| facts | preft-lora-r16 | 0.005 |" in doc
    assert (tmp / "q.png").stat().st_size > 1000


def test_trained_adapters_went_through_the_engine(quick: tuple) -> None:
    _, _, results = quick
    cells = {c["config"]: c for c in results["cells"]}
    base = cells["base"]["test_token_ids"]
    preft, full = cells["preft-lora-r16"]["test_token_ids"], cells["all-lora-r16"]["test_token_ids"]
    assert any(p != b for p, b in zip(preft, base))
    assert any(f != p for f, p in zip(full, preft))  # the two modes are served differently


def test_one_served_preft_reply_equals_the_hf_oracle(quick: tuple) -> None:
    from transformers import AutoTokenizer

    from tests.engine import oracle

    _, _, results = quick
    cell = next(c for c in results["cells"] if c["config"] == "preft-lora-r16")
    model = results["meta"]["model"]
    tokenizer = AutoTokenizer.from_pretrained(model)
    question = make_tasks()["facts"].test[0].question
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    served = cell["test_token_ids"][0]
    assert served == oracle.generate_prefill(model, cell["adapter"], ids, len(served))


def test_rerun_skips_finished_cells(quick: tuple) -> None:
    tmp, _, before = quick
    stdout = run_quick(tmp)
    after = json.loads((tmp / "q.json").read_text())
    assert after["cells"] == before["cells"]
    assert stdout.count("[skip]") == 3 and "[cell]" not in stdout
    assert "starting the vLLM engine" not in stdout  # nothing left to serve
    assert after["meta"]["last_run_cells"] == 0


def test_tasks_are_deterministic_disjoint_and_checkable() -> None:
    a, b = make_tasks(), make_tasks()
    assert a.keys() == {"facts", "dates", "json"}
    for name, task in a.items():
        assert (task.train, task.validation, task.test) == (
            b[name].train,
            b[name].validation,
            b[name].test,
        )
        train = {i.question for i in task.train}
        assert not train & {i.question for i in task.validation + task.test}, name
        for item in task.test:
            assert task.check(item.answer, item.answer)
            assert not task.check("I'm sorry, I don't know.", item.answer)
    assert a["json"].check(
        ' {"c": "Graz", "y": 29, "n": "Bruno"}', '{"n":"Bruno","y":29,"c":"Graz"}'
    )


def test_lr_is_picked_on_validation_loss_and_seeds_are_averaged() -> None:
    def cell(lr: float, seed: int, val: float, test: float) -> dict:
        return {
            "task": "t",
            "config": "c",
            "lr": lr,
            "seed": seed,
            "val_loss": val,
            "test_loss": test,
            "test_acc": 0.5,
            "validation_acc": 0.5,
            "x_base": 0.9,
        }

    results = {"cells": [cell(1e-3, 0, 2.0, 2.1), cell(1e-2, 0, 1.0, 1.2), cell(1e-2, 1, 1.1, 1.4)]}
    (row,) = quality_bench.summarise(results)
    assert row["lr"] == 1e-2 and row["seeds"] == 2
    assert row["test_loss"] == pytest.approx(1.3)


def test_throughput_is_each_configurations_closest_engine_measurement(tmp_path: Path) -> None:
    assert quality_bench.measured_throughput(tmp_path) == []

    def result(name: str, rank: int, quick: bool, runs: list, started: str = "") -> None:
        meta = {
            "model_name": name,
            "rank": rank,
            "reft_rank": rank,
            "quick": quick,
            "max_loras": 8,
            "started": started,
        }
        (tmp_path / f"engine_bench_{name}_{rank}_{quick}{started}.json").write_text(
            json.dumps({"meta": meta, "runs": runs})
        )

    def row(mode: str, adapters: int, tps: float, max_loras: int = 8) -> dict:
        return {
            "mode": mode,
            "adapters": adapters,
            "max_loras": max_loras,
            "output_tokens_per_s": tps,
        }

    result("bench-llama", 16, False, [row("base", 0, 100.0), row("preft-lora", 512, 80.0)])
    result(
        "smol",
        16,
        False,
        [
            row("base", 0, 10.0),
            row("preft-lora", 64, 9.0),
            row("preft-lora", 512, 9.5),
            row("preft-lora", 512, 3.0, 32),
        ],
    )
    result("smol", 64, True, [row("base", 0, 10.0), row("preft-lora", 64, 8.0)])
    result(
        "bench-llama",
        16,
        False,
        [row("base", 0, 100.0), row("all-lora", 512, 25.0)],
        started="2026-01-01",
    )  # an older run of the same: the newer one counts
    result(
        "bench-llama",
        16,
        False,
        [row("base", 0, 100.0), row("all-lora", 512, 20.0)],
        started="2026-02-01",
    )
    measured = quality_bench.measured_throughput(tmp_path)
    assert all(r["x_base"] != 0.3 for r in measured)  # the 32-slot sweep row is left out
    lora = quality_bench.CONFIGS

    def pick(name: str) -> tuple:
        got = quality_bench.config_throughput(lora[name], "smol", measured)
        return None if got is None else (got["model"], got["rank"], got["x_base"])

    assert pick("preft-lora-r16") == ("smol", 16, 0.95)  # same model and rank, most adapters
    assert pick("preft-lora-r64") == ("smol", 64, 0.8)  # same rank (quick) beats another rank
    assert pick("preft-lora-r4") == ("smol", 16, 0.95)  # same model, nearest full run
    assert pick("all-lora-r16") == ("bench-llama", 16, 0.2)  # only another model has it
    assert pick("preft-direft-r4") is None
    rows = quality_bench.attach_throughput(
        [{"config": "base"}, {"config": "all-lora-r16"}, {"config": "preft-direft-r4"}],
        "smol",
        measured,
    )
    assert [r["x_base"] for r in rows] == [1.0, 0.2, None]


def test_reft_throughput_prefers_a_run_at_the_configurations_positions(tmp_path: Path) -> None:
    """The study's ReFT adapters intervene on every prompt token ('prefill'); an engine run
    at f7+l7 (the engine benchmark's default, and every run before the flag) is only a
    fallback, and the table says so."""

    def result(name: str, positions: str | None, x_base: float) -> None:
        meta = {
            "model_name": "smol",
            "rank": 16,
            "reft_rank": 4,
            "quick": False,
            "max_loras": 8,
            "started": "2026-12-02",
        }
        if positions is not None:
            meta["reft_positions"] = positions
        runs = [
            {"mode": "base", "adapters": 0, "max_loras": 8, "output_tokens_per_s": 10.0},
            {
                "mode": "preft-direft",
                "adapters": 64,
                "max_loras": 8,
                "output_tokens_per_s": 10.0 * x_base,
            },
        ]
        (tmp_path / f"engine_bench_{name}.json").write_text(
            json.dumps({"meta": meta, "runs": runs})
        )

    result("old", None, 0.97)  # before --reft-positions: f7+l7
    config = quality_bench.CONFIGS["preft-direft-r4"]
    assert config.positions == "prefill"
    got = quality_bench.config_throughput(
        config, "smol", quality_bench.measured_throughput(tmp_path)
    )
    assert got is not None and (got["positions"], got["x_base"]) == ("f7+l7", 0.97)
    rows = quality_bench.attach_throughput(
        [
            {
                "config": "preft-direft-r4",
                "task": "facts",
                "lr": 5e-3,
                "seeds": 1,
                "test_loss": 0.1,
                "test_acc": 1.0,
                "val_acc": 1.0,
            }
        ],
        "smol",
        quality_bench.measured_throughput(tmp_path),
    )
    assert "0.97 (positions f7+l7)" in quality_bench.table(rows, "smol")

    result("new", "prefill", 0.91)
    got = quality_bench.config_throughput(
        config, "smol", quality_bench.measured_throughput(tmp_path)
    )
    assert got is not None and (got["positions"], got["x_base"]) == ("prefill", 0.91)


def test_the_sweep_completes_a_first_pass_before_other_lrs() -> None:
    """A run cut off after the first |tasks| x |configs| cells still has a full table."""
    plan = quality_bench.Plan(
        tasks=("facts", "dates"),
        configs=quality_bench.FULL_CONFIGS,
        lrs=quality_bench.FULL_LRS,
        seeds=(0, 1),
        steps=40,
        batch_size=8,
    )
    cells = list(quality_bench.sweep_cells(plan))
    first = cells[: 2 * len(quality_bench.FULL_CONFIGS)]
    assert {lr for _, _, lr, _ in first} == {quality_bench.FULL_LRS[0]}
    assert {(t, c.name) for t, c, _, _ in first} == {
        (t, c.name) for t in plan.tasks for c in quality_bench.FULL_CONFIGS
    }
    assert len(cells) == len(set(cells)) == 2 * len(quality_bench.FULL_CONFIGS) * 3
    lora = sum(c.type == "lora" for c in quality_bench.FULL_CONFIGS)
    assert {c.type for _, c, _, _ in first[: 2 * lora]} == {"lora"}  # the findings' cells


def test_a_killed_run_leaves_no_trainer_behind(tmp_path: Path) -> None:
    """Each cell trains in a child process; stopping the run (SIGTERM) must stop it too."""
    import signal
    import time

    import psutil

    cmd = [
        sys.executable,
        "-m",
        "bench.studies.quality_bench",
        "--quick",
        "--model",
        "tiny-llama",
        "--steps",
        "100000",
        "--out",
        str(tmp_path / "q.json"),
        "--work",
        str(tmp_path / "work"),
        "--doc",
        "-",
    ]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TQDM_DISABLE": "1"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # base cells are scored first, then the first cell trains
            if line.startswith("[train]"):
                break
        deadline = time.monotonic() + 60
        while not (trainers := psutil.Process(proc.pid).children(recursive=True)):
            assert time.monotonic() < deadline, "the cell should train in a child process"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
        deadline = time.monotonic() + 30
        while any(t.is_running() and t.status() != psutil.STATUS_ZOMBIE for t in trainers):
            assert time.monotonic() < deadline, "the trainer outlived the run"
            time.sleep(0.5)
    finally:
        proc.kill()
        proc.wait()


def test_an_unknown_configuration_is_refused_with_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text("{}")  # a model directory, never loaded
    code = quality_bench.main(
        [
            "--configs",
            "preft-lora-r16,preft-lora-r99",
            "--model",
            str(tmp_path),
            "--out",
            str(tmp_path / "q.json"),
            "--doc",
            "-",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "unknown configuration(s) preft-lora-r99" in err and "preft-loreft-r16" in err
    assert not (tmp_path / "q.json").exists()
