"""The engine benchmark's own logic: plan, aggregation, and the quick mode's sanity check.

Nothing here times the machine: the sanity check is exercised on the recorded quick run
(a copy of one ``--quick`` run, ``recorded/engine_bench_quick.json``) and on made-up
rounds. Its tiny end-to-end run is in ``tests/benchmarks``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bench import engine_bench, engine_report
from bench.engine_bench import Run, Shape

RECORDED_QUICK = Path(__file__).parent / "recorded" / "engine_bench_quick.json"


def rounds_for(ratios: dict[str, list[float]], base_cpu_s: float = 5.0) -> list[dict]:
    """Raw records: a base round and one per mode per round, at the given ratios."""
    out = []
    n = len(next(iter(ratios.values())))
    for i in range(n):
        out.append(
            {
                "mode": "base",
                "adapters": 0,
                "max_loras": 8,
                "group": 0,
                "round": i,
                "elapsed_s": base_cpu_s,
                "cpu_s": base_cpu_s,
                "output_tokens": 1000,
                "output_tokens_per_s": 1000 / base_cpu_s,
                "total_tokens_per_s": 0.0,
            }
        )
        for mode, values in ratios.items():
            t = base_cpu_s / values[i]
            out.append(
                {
                    "mode": mode,
                    "adapters": 64,
                    "max_loras": 8,
                    "group": 0,
                    "round": i,
                    "elapsed_s": t,
                    "cpu_s": t,
                    "output_tokens": 1000,
                    "output_tokens_per_s": 1000 / t,
                    "total_tokens_per_s": 0.0,
                }
            )
    return out


def result_of(raw: list[dict], **meta) -> dict:
    meta = {"warmup_excluded": True, "interleaved": True, **meta}
    return {"meta": meta, "runs": engine_report.aggregate(raw), "rounds": raw}


def test_ratios_are_taken_within_a_round_and_summarised_by_the_median() -> None:
    raw = rounds_for({"preft-lora": [0.9, 0.5, 0.92], "all-lora": [0.3, 0.31, 0.29]})
    # A neighbour slows round 1 for everyone: the per-round ratio does not care.
    for r in raw:
        if r["round"] == 1:
            r["cpu_s"] *= 3
    rows = {r["mode"]: r for r in engine_report.aggregate(raw)}
    assert rows["preft-lora"]["x_base"] == pytest.approx(0.9)
    assert rows["preft-lora"]["x_base_min"] == pytest.approx(0.5)
    assert rows["all-lora"]["x_base"] == pytest.approx(0.3)
    assert rows["base"]["x_base"] == 1.0 and rows["base"]["rounds"] == 3


def test_sanity_accepts_base_as_upper_bound_within_the_margin() -> None:
    raw = rounds_for({"preft-direft": [1.02, 0.99, 1.03], "stock-lora": [0.2, 0.2, 0.2]})
    assert engine_report.sanity(result_of(raw)) == []


def test_sanity_rejects_a_mode_faster_than_base() -> None:
    """What the old --quick reported (PreFT-DiReFT 3x base) is caught."""
    raw = rounds_for({"preft-direft": [2.9, 3.0, 3.1], "preft-lora": [0.9, 0.9, 0.9]})
    problems = engine_report.sanity(result_of(raw))
    assert len(problems) == 1 and "preft-direft" in problems[0]


@pytest.mark.parametrize(
    "defect,expected",
    [
        ("rounds", "rounds (<"),
        ("short", "too little work"),
        ("warmup", "warm-up"),
        ("interleaved", "interleaved"),
    ],
)
def test_sanity_rejects_measurements_that_cannot_give_ratios(defect: str, expected: str) -> None:
    n = 2 if defect == "rounds" else 3
    raw = rounds_for({"preft-lora": [0.9] * n}, base_cpu_s=0.5 if defect == "short" else 5.0)
    meta = {"warmup_excluded": defect != "warmup", "interleaved": defect != "interleaved"}
    problems = engine_report.sanity(result_of(raw, **meta))
    assert any(expected in p for p in problems), problems


def test_recorded_quick_run_is_sane_and_complete() -> None:
    """The committed quick run passes its own check, covers every mode, and fails it
    once an adapter mode is made to beat the base model."""
    result = json.loads(RECORDED_QUICK.read_text())
    assert result["meta"]["quick"]
    assert engine_report.sanity(result) == []
    assert {r["mode"] for r in result["runs"]} == set(engine_report.MODES)
    broken = copy.deepcopy(result)
    for r in broken["rounds"]:
        if r["mode"] == "preft-lora":
            r["cpu_s"] /= 2
            r["elapsed_s"] /= 2
            r["output_tokens_per_s"] *= 2
    broken["runs"] = engine_report.aggregate(
        broken["rounds"], broken["engines"], broken["meta"]["basis"]
    )
    assert any("preft-lora" in p for p in engine_report.sanity(broken))


def test_quick_settings_give_the_sanity_check_enough_to_work_with() -> None:
    w = engine_bench.workload(engine_bench.parser().parse_args(["--quick"]))
    assert w["rounds"] >= engine_report.SANITY_MIN_ROUNDS
    assert w["warmup_requests"] > 0 and w["sweep"] == []
    assert w["requests"] >= max(w["counts"])  # every adapter appears in every round
    assert w["requests"] * (w["prompt_len"] + w["output_len"]) >= 8192
    full = engine_bench.workload(engine_bench.parser().parse_args([]))
    assert full["counts"] == [1, 8, 64, 512] and full["requests"] >= 512


def test_plan_measures_every_mode_at_equal_and_swept_max_loras() -> None:
    groups = engine_bench.plan([1, 8, 512], 8, [8, 32, 1024])
    assert [g[0].adapters for g in groups] == [1, 8, 512, 512]
    assert {r.mode for r in groups[0]} == set(engine_report.ADAPTER_MODES)
    assert {r.max_loras for r in groups[3]} == {32}  # 8 is the equal run, 1024 > 512


def test_pack_splits_groups_that_do_not_fit_in_memory() -> None:
    shape = Shape(
        layers=30, hidden=576, q=576, kv=192, intermediate=1536, vocab=49152, params_bytes=540 << 20
    )
    common = {"kv_bytes": 1 << 30, "adapter_bytes": 7 << 20, "rank": 16}
    group = [Run(m, 512, 8) for m in engine_report.ADAPTER_MODES]
    assert len(engine_bench.pack(group, shape, common, budget=64 << 30)) == 1
    parts = engine_bench.pack(group, shape, common, budget=12 << 30)
    assert len(parts) > 1 and [r for p in parts for r in p] == group
    # vLLM's slot buffers cover every linear layer and the embedding: ~22 MiB for SmolLM2.
    assert 20 << 20 < shape.slot_bytes(16) < 24 << 20


def test_every_engine_gets_the_prefill_budget_the_adapter_modes_can_fill() -> None:
    """With 2048 tokens base prefilled 16 prompts a step, the adapter modes 8, and base came
    out below PreFT: the reference was not the upper bound."""
    args = engine_bench.parser().parse_args(["--quick"])
    w = engine_bench.workload(args)
    assert engine_bench.batch_tokens(args, w) == args.max_loras * w["prompt_len"]
    args = engine_bench.parser().parse_args(["--quick", "--batch-tokens", "4096"])
    assert engine_bench.batch_tokens(args, engine_bench.workload(args)) == 4096


def test_model_option_takes_any_hf_directory(tmp_path: Path) -> None:
    """``--model DIR``: a Hugging Face directory (here SmolLM2-135M-Instruct's config:
    30 layers, GQA 9/3 heads, tied embeddings) is used as is; its shape drives the memory
    plan. Anything else must be a preset."""
    model = tmp_path / "smollm2"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 576,
                "head_dim": 64,
                "intermediate_size": 1536,
                "num_attention_heads": 9,
                "num_hidden_layers": 30,
                "num_key_value_heads": 3,
                "tie_word_embeddings": True,
                "vocab_size": 49152,
            }
        )
    )
    (model / "model.safetensors").write_bytes(b"\0" * 1024)
    path, name = engine_bench.resolve_model(str(model), tmp_path / "var")
    assert (path, name) == (model, "smollm2")
    shape = Shape.of(path)
    assert (shape.layers, shape.q, shape.kv, shape.vocab, shape.params_bytes) == (
        30,
        576,
        192,
        49152,
        1024,
    )
    with pytest.raises(SystemExit, match="neither a model directory nor a preset"):
        engine_bench.resolve_model(str(tmp_path / "missing"), tmp_path / "var")


def test_reft_positions_option_sets_the_adapters_positions_and_is_checked(tmp_path: Path) -> None:
    """The quality study's ReFT adapters intervene on every prompt token; the engine
    benchmark measures those with ``--reft-positions prefill`` (default f7+l7)."""
    from preft_serve.toymodels import make_model

    with pytest.raises(SystemExit):
        engine_bench.parser().parse_args(["--reft-positions", "f7-l7"])
    assert engine_bench.parser().parse_args([]).reft_positions == "f7+l7"
    args = engine_bench.parser().parse_args(["--reft-positions", "prefill"])
    model = make_model("tiny-llama", tmp_path / "model")
    engine_bench.prepare_adapters(model, tmp_path / "adapters", 1, 4, 4, args.reft_positions)
    for kind in ("direft", "loreft"):
        config = json.loads(
            (tmp_path / "adapters" / f"{kind}-0" / "adapter_config.json").read_text()
        )
        assert config["positions"] == "prefill", config
