"""Adapters saved by plain peft with ``target_modules="all-linear"`` or a regex:
accepted by the registry's validation unchanged, stored as the registry stores them, served
by the shared engine equal to the HF + peft oracle (and not equal to the base model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE, AdapterMode
from preft_serve.registry.validation import BaseModelSpec, UploadBounds, validate_adapter
from tests.engine import oracle
from tests.support.engine import Engine, prompt

FORMS: dict[str, tuple[Any, AdapterMode]] = {
    "all-linear": ("all-linear", AdapterMode.PREFILL),
    "regex": (r".*\.(q|v|down)_proj", AdapterMode.ALL),
}
MAX_TOKENS = 12


def plain_peft_adapter(model_dir: Path, out: Path, target_modules: Any, seed: int) -> Path:
    """get_peft_model + save_pretrained; A and B random (std 0.3) so outputs change."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(
        base, LoraConfig(r=8, lora_alpha=8, lora_dropout=0.0, target_modules=target_modules)
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    model.save_pretrained(out)
    return out


def as_stored(model_dir: Path, adapter: Path, mode: AdapterMode, out: Path) -> Path:
    """What a worker fetches after the upload: the registry's stored config, same weights."""
    base = BaseModelSpec.load(model_dir.name, model_dir / "config.json")
    validated = validate_adapter(
        adapter / CONFIG_FILE, adapter / WEIGHTS_FILE, mode, base, UploadBounds(), strict=True
    )
    out.mkdir(parents=True)
    (out / CONFIG_FILE).write_bytes(validated.config_bytes)
    (out / WEIGHTS_FILE).write_bytes((adapter / WEIGHTS_FILE).read_bytes())
    return out


@pytest.mark.parametrize("form", list(FORMS))
def test_plain_peft_form_served_equal_to_oracle(
    form: str, engines: dict[str, Engine], tmp_path: Path
) -> None:
    llama = engines["tiny-llama"]
    target_modules, mode = FORMS[form]
    saved = plain_peft_adapter(llama.model_dir, tmp_path / "peft", target_modules, seed=7)
    stored = as_stored(llama.model_dir, saved, mode, tmp_path / "stored")
    lora = llama.lora(f"peft-{form}", stored)
    generate = oracle.generate_prefill if mode is AdapterMode.PREFILL else oracle.generate_all
    for seed, length in ((11, 9), (12, 40)):
        ids = prompt(seed, length)
        served = llama.tokens([ids], [lora], MAX_TOKENS)[0]
        assert served == generate(llama.model_dir, stored, ids, MAX_TOKENS)
        assert served != oracle.generate_base(llama.model_dir, ids, MAX_TOKENS)
