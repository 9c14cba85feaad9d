"""A generated toy model (and its byte-level chat tokenizer) shared by the training tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from preft_serve.toymodels import make_model


@pytest.fixture(scope="session")
def toy_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny-llama", tmp_path_factory.mktemp("train-model") / "tiny-llama")


@pytest.fixture(scope="session")
def toy_tokenizer(toy_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(toy_model))
