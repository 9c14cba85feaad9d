"""PEFT adapters as PEFT saves them: every ``target_modules`` form, built with
plain ``peft`` (``get_peft_model`` + ``save_pretrained``) and uploaded unchanged; the
registry resolves the same modules PEFT wrapped; doubtful settings warn, or fail in strict
mode; ``preft adapter convert`` turns ``adapter_model.bin`` into safetensors safely."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE
from preft_serve.registry.validation import AdapterRejected, BaseModelSpec
from preft_serve.registry.validation.targets import resolve_targets
from tests.registry import factories
from tests.support.cli import run_cli
from tests.support.registry_api import error_message

# Each form PEFT accepts, with the LoraConfig extras it is used with.
FORMS: dict[str, dict[str, Any]] = {
    "all-linear": {"target_modules": "all-linear"},
    "regex": {"target_modules": r".*\.(q|v)_proj"},
    "regex on one layer": {"target_modules": r"model\.layers\.1\.(self_attn|mlp)\..*_proj"},
    "suffixes": {"target_modules": ["self_attn.q_proj", "mlp.down_proj"]},
    "short names": {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    "short names, one layer": {"target_modules": ["q_proj", "up_proj"], "layers_to_transform": [1]},
    "layers_pattern": {
        "target_modules": ["v_proj"],
        "layers_to_transform": 0,
        "layers_pattern": "layers",
    },
    # A whole module name is matched as such; PEFT applies layers_to_transform to suffixes only.
    "full name bypasses layer filter": {
        "target_modules": ["model.layers.0.self_attn.q_proj", "o_proj"],
        "layers_to_transform": [1],
    },
    "all-linear minus suffix": {"target_modules": "all-linear", "exclude_modules": ["down_proj"]},
    "exclude regex": {"target_modules": ["q_proj", "gate_proj"], "exclude_modules": r".*\.0\..*"},
}


def peft_adapter(base_model_dir: Path, out: Path, seed: int = 0, **lora: Any) -> Path:
    """An adapter saved by plain peft, with non-zero lora_B so it changes outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, **lora))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    peft_model.save_pretrained(out)
    return out


def wrapped_modules(base_model_dir: Path, **lora: Any) -> set[str]:
    """The module names PEFT itself put LoRA layers on."""
    import torch
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=4, **lora))
    return {
        name.removeprefix("base_model.model.")
        for name, module in peft_model.named_modules()
        if isinstance(module, LoraLayer)
    }


@pytest.fixture(scope="module")
def base(base_model_dir: Path) -> BaseModelSpec:
    return BaseModelSpec.load("tiny-llama", base_model_dir / "config.json")


@pytest.mark.parametrize("form", list(FORMS))
def test_resolution_equals_peft(form, base, base_model_dir, tmp_path):
    """The registry's resolution of the *saved* config is the set PEFT wrapped."""
    adapter = peft_adapter(base_model_dir, tmp_path / "a", **FORMS[form])
    saved = json.loads((adapter / CONFIG_FILE).read_text())
    resolved = {t.path for t in resolve_targets(saved, base).targets}
    assert resolved == wrapped_modules(base_model_dir, **FORMS[form])
    assert resolved  # every form targets something


@pytest.mark.parametrize("form", list(FORMS))
def test_plain_peft_adapter_uploads_unchanged(
    form, client, acme, base_model_dir, tmp_path, s3, bucket
):
    adapter = peft_adapter(base_model_dir, tmp_path / "a", **FORMS[form])
    assert (adapter / "README.md").is_file()  # the folder as PEFT wrote it; the CLI sends
    resp = _post(client, acme, adapter, strict=True)  # the two adapter files, as here
    assert resp.status_code == 201, resp.text
    assert resp.json()["warnings"] == []
    # Stored as uploaded (plus preft_mode): vLLM loads LoRA by tensor names and only needs
    # target_modules to be present, so no form is rewritten.
    key = f"adapters/{resp.json()['sha256']}/{CONFIG_FILE}"
    stored = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    uploaded = json.loads((adapter / CONFIG_FILE).read_text())
    assert stored == {**uploaded, "preft_mode": "all"}


def test_entry_matching_nothing_warns(base):
    resolution = resolve_targets({"target_modules": ["q_proj", "c_attn"]}, base)
    assert [t.module for t in resolution.targets] == ["q_proj", "q_proj"]
    assert resolution.warnings == [
        (
            "target_modules entry 'c_attn' matches no module of the base model (LlamaForCausalLM); "
            "use names like q_proj, self_attn.q_proj, a regex, or 'all-linear'"
        )
    ]


def test_warnings_are_bounded(base):
    """A list may hold 16,384 entries: the 201 must not carry a warning for each."""
    resolution = resolve_targets(
        {"target_modules": ["q_proj"] + [f"nope{i}" for i in range(5000)]}, base
    )
    assert len(resolution.warnings) == 21
    assert resolution.warnings[0].startswith("target_modules entry 'nope0' matches no module")
    assert resolution.warnings[-1] == (
        "... and 4980 more target_modules entries that match no module"
    )


def test_slow_regex_is_bounded(base, monkeypatch):
    from preft_serve.registry.validation import targets

    monkeypatch.setattr(targets, "MATCH_SECONDS", 0.0)
    with pytest.raises(AdapterRejected, match="takes over 0 s to match 33 module names"):
        resolve_targets({"target_modules": r".*q_proj"}, base)


def _post(client, headers, adapter: Path, strict: bool) -> Any:
    files = [
        ("files", (n, (adapter / n).read_bytes(), "application/octet-stream"))
        for n in (CONFIG_FILE, WEIGHTS_FILE)
    ]
    return client.post(
        "/v1/adapters",
        data={"name": "bot", "mode": "all"},
        files=files,
        headers=headers,
        params={"strict": "true"} if strict else None,
    )


@pytest.mark.parametrize(
    "edit, warning",
    [
        (
            {"base_model_name_or_path": "meta-llama/Llama-3.1-8B"},
            (
                "adapter_config.json names base_model_name_or_path "
                "'meta-llama/Llama-3.1-8B', but this "
                "registry serves 'tiny-llama', LlamaForCausalLM; the shapes match"
            ),
        ),
        (
            {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "c_attn"]},
            "target_modules entry 'c_attn' matches no module of the base model",
        ),
    ],
)
def test_doubtful_adapter_warns_or_fails_strict(
    edit, warning, client, acme, lora_dir, tmp_path, state_snapshot
):
    adapter = factories.edit_config(factories.copy_adapter(lora_dir, tmp_path / "a"), **edit)
    before = state_snapshot()
    resp = _post(client, acme, adapter, strict=True)
    assert resp.status_code == 422, resp.text
    assert error_message(resp).startswith(f"strict mode: {warning}")
    assert state_snapshot() == before
    resp = _post(client, acme, adapter, strict=False)
    assert resp.status_code == 201, resp.text
    [shown] = resp.json()["warnings"]
    assert shown.startswith(warning)
    # Re-uploading identical content is a no-op that still reports the warning.
    again = _post(client, acme, adapter, strict=False)
    assert again.status_code == 200 and again.json()["warnings"] == [shown]


@pytest.mark.parametrize(
    "name", ["tiny-llama", "/somewhere/else/tiny-llama/", "someorg/Tiny-Llama", None, ""]
)
def test_base_model_names_that_mean_the_served_model(name, client, acme, lora_dir, tmp_path):
    adapter = factories.edit_config(
        factories.copy_adapter(lora_dir, tmp_path / "a"), base_model_name_or_path=name
    )
    resp = _post(client, acme, adapter, strict=True)
    assert resp.status_code == 201, resp.text
    assert resp.json()["warnings"] == []


def test_convert_bin_then_upload(base_model_dir, tmp_path, capsys, client, acme):
    import torch
    from safetensors.torch import load_file

    src = tmp_path / "old"
    peft_adapter(base_model_dir, src, target_modules="all-linear")
    state = load_file(str(src / WEIGHTS_FILE))
    (src / WEIGHTS_FILE).unlink()
    torch.save(state, src / "adapter_model.bin")  # what save_pretrained(safe_serialization=
    # False) and older PEFT versions write
    out = tmp_path / "new"
    code, stdout, err = run_cli(capsys, "adapter", "convert", str(src), "--out", str(out))
    assert code == 0, err
    assert stdout.startswith(f"wrote {out / WEIGHTS_FILE}; upload with: preft adapter upload")
    converted = load_file(str(out / WEIGHTS_FILE))
    assert converted.keys() == state.keys()
    assert all(torch.equal(converted[k], state[k]) for k in state)
    assert (out / CONFIG_FILE).read_bytes() == (src / CONFIG_FILE).read_bytes()
    assert _post(client, acme, out, strict=True).status_code == 201
    # In place (default), and never over an existing file without --force.
    assert run_cli(capsys, "adapter", "convert", str(src / "adapter_model.bin"))[0] == 0
    code, _, err = run_cli(capsys, "adapter", "convert", str(src))
    assert code == 1 and "already exists; pass --force to overwrite it" in err
    assert run_cli(capsys, "adapter", "convert", str(src), "--force")[0] == 0


class _Payload:
    def __reduce__(self) -> Any:
        return (Path.touch, (Path(_Payload.marker),))

    marker = ""


def test_convert_refuses_pickled_code(tmp_path, lora_dir, capsys):
    src = factories.copy_adapter(lora_dir, tmp_path / "evil")
    (src / WEIGHTS_FILE).unlink()
    _Payload.marker = str(tmp_path / "pwned")
    (src / "adapter_model.bin").write_bytes(pickle.dumps({"w": _Payload()}))
    code, _, err = run_cli(capsys, "adapter", "convert", str(src))
    assert code == 1
    assert "cannot be read as tensors with torch.load(weights_only=True)" in err
    assert not (tmp_path / "pwned").exists()
    assert not (src / WEIGHTS_FILE).exists()
    code, _, err = run_cli(capsys, "adapter", "convert", str(tmp_path / "nowhere"))
    assert (code, err) == (1, f"error: {tmp_path / 'nowhere'} does not exist\n")
