"""The training loop's contract: resumable checkpoints, metrics JSON, the CLI's errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from preft_serve import cli
from preft_serve.adapters.format import CONFIG_FILE, MODE_KEY, WEIGHTS_FILE
from preft_serve.training import trainer
from preft_serve.training.spec import AdapterSpec
from preft_serve.training.trainer import METRICS_FILE, TrainConfig, train

FACTS = [("Pet?", "Rex"), ("City?", "Oslo"), ("Sign-off?", "Bye"), ("Colour?", "Teal")]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "facts.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            )
            + "\n"
            for q, a in FACTS
        )
    )
    return path


def config(data: Path, model: Path, out: Path, **kw: object) -> TrainConfig:
    return TrainConfig(
        data=data,
        model=model,
        out=out,
        adapter=AdapterSpec(rank=4),
        max_steps=6,
        batch_size=2,
        learning_rate=1e-2,
        progress=False,
        **kw,
    )


def test_resume_continues_where_the_interrupted_run_stopped(
    data: Path, toy_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    straight = train(config(data, toy_model, tmp_path / "straight"), say=lambda _: None)

    real_save = trainer._save_checkpoint

    def save_then_die(*args: object, **kwargs: object) -> None:
        real_save(*args, **kwargs)  # type: ignore[arg-type]
        raise KeyboardInterrupt  # the machine went away right after the checkpoint

    monkeypatch.setattr(trainer, "_save_checkpoint", save_then_die)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        train(config(data, toy_model, out, save_every=3), say=lambda _: None)
    assert (out / "checkpoints" / "step-3" / "state.pt").is_file()
    assert not (out / WEIGHTS_FILE).exists()
    monkeypatch.setattr(trainer, "_save_checkpoint", real_save)
    said: list[str] = []
    resumed = train(config(data, toy_model, out, save_every=3, resume=True), say=said.append)
    assert any("resumed from" in line and "step 3/6" in line for line in said)
    want, got = load_file(str(straight.out / WEIGHTS_FILE)), load_file(str(out / WEIGHTS_FILE))
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-6)
    assert [p["loss"] for p in resumed.metrics["train_loss"]] == pytest.approx(
        [p["loss"] for p in straight.metrics["train_loss"]], abs=1e-5
    )
    assert not (out / "checkpoints").exists()  # removed once the adapter is saved


def test_metrics_json_and_adapter_files(data: Path, toy_model: Path, tmp_path: Path) -> None:
    result = train(
        config(data, toy_model, tmp_path / "a", validation=data, eval_every=2), say=lambda _: None
    )
    metrics = json.loads((result.out / METRICS_FILE).read_text())
    assert metrics["steps"] == 6 and len(metrics["train_loss"]) == 6
    assert [p["step"] for p in metrics["eval_loss"]] == [2, 4, 6]
    assert metrics["eval_loss"][-1]["loss"] < metrics["eval_loss"][0]["loss"]
    assert metrics["examples"] == len(FACTS)
    # tokens seen = 6 steps x 2 examples, each example's prompt + response tokens
    assert metrics["tokens_seen"] > metrics["response_tokens_seen"] > 0
    assert metrics["config"]["adapter"]["rank"] == 4 and metrics["wall_seconds"] > 0
    adapter_config = json.loads((result.out / CONFIG_FILE).read_text())
    assert adapter_config["peft_type"] == "LORA" and adapter_config[MODE_KEY] == "prefill"
    assert sorted(p.name for p in result.out.iterdir()) == sorted(
        [CONFIG_FILE, WEIGHTS_FILE, METRICS_FILE]
    )


def run_cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().err


def test_cli_reports_bad_data_with_the_line(
    tmp_path: Path, toy_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    code, err = run_cli(
        "train",
        str(bad),
        "--model",
        str(toy_model),
        "--out",
        str(tmp_path / "o"),
        "--quiet",
        capsys=capsys,
    )
    assert code == 1 and "line 1: no assistant message" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--type", "direft", "--mode", "all"], "ReFT adapters are prefill-only"),
        (["--target-modules", "q_proj,lm_head"], "--target-modules 'lm_head' are not supported"),
        (["--type", "loreft", "--positions", "middle"], "'positions' must be"),
        (["--rank", "0"], "--rank must be at least 1"),
        (["--type", "direft", "--layers", "0,7"], "--layers [7] out of range"),
    ],
)
def test_cli_refuses_bad_adapter_flags(
    tmp_path: Path,
    toy_model: Path,
    data: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    message: str,
) -> None:
    code, err = run_cli(
        "train",
        str(data),
        "--model",
        str(toy_model),
        "--out",
        str(tmp_path / "o"),
        "--quiet",
        "--steps",
        "1",
        *flags,
        capsys=capsys,
    )
    assert code == 1 and message in err, err


def test_cli_refuses_a_model_that_is_not_a_model_directory(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_cli(
        "train", str(data), "--model", str(tmp_path), "--out", str(tmp_path / "o"), capsys=capsys
    )
    assert code == 1 and "is not a model directory" in err and "preft model prepare" in err


@pytest.mark.parametrize("kind", ["lora", "direft"])
def test_bfloat16_training_learns_and_saves_float32_weights(
    data: Path, toy_model: Path, tmp_path: Path, kind: str
) -> None:
    from preft_serve.adapters.format import AdapterType

    spec = AdapterSpec(type=AdapterType(kind), rank=4, positions="prefill")
    result = train(
        TrainConfig(
            data=data,
            model=toy_model,
            out=tmp_path / kind,
            adapter=spec,
            max_steps=8,
            batch_size=4,
            learning_rate=2e-2,
            dtype="bfloat16",
            progress=False,
        ),
        say=lambda _: None,
    )
    curve = [p["loss"] for p in result.metrics["train_loss"]]
    assert curve[-1] < curve[0]
    assert {t.dtype for t in load_file(str(result.out / WEIGHTS_FILE)).values()} == {torch.float32}
