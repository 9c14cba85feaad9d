"""Deterministic PEFT-format LoRA adapters for generated (or real) models."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from preft_serve.adapters.format import CONFIG_FILE, MODE_KEY, WEIGHTS_FILE, AdapterMode

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """Shape and strength of a generated LoRA adapter."""

    rank: int = 8
    target_modules: tuple[str, ...] = ATTENTION_MODULES
    std: float = 0.3
    mode: AdapterMode = AdapterMode.PREFILL
    alpha: int | None = None  # defaults to rank (scale 1)


def _module_shapes(model_config: dict[str, Any], module: str) -> tuple[int, int]:
    """(in_features, out_features) of a decoder projection from a HF config.json."""
    hidden = model_config["hidden_size"]
    heads = model_config["num_attention_heads"]
    head_dim = model_config.get("head_dim") or hidden // heads
    kv = model_config.get("num_key_value_heads", heads) * head_dim
    inter = model_config["intermediate_size"]
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }[module]


def make_lora_adapter(
    model_dir: str | Path, directory: str | Path, seed: int, spec: LoraSpec = LoraSpec()
) -> Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` for ``model_dir``.

    Both A and B are random (unlike training init, where B=0) so the adapter changes output.
    """
    import torch
    from safetensors.torch import save_file

    model_dir, directory = Path(model_dir), Path(directory)
    model_config = json.loads((model_dir / "config.json").read_text())
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(model_config["num_hidden_layers"]):
        for module in spec.target_modules:
            group = "self_attn" if module in ATTENTION_MODULES else "mlp"
            fan_in, fan_out = _module_shapes(model_config, module)
            prefix = f"base_model.model.model.layers.{layer}.{group}.{module}"
            a = torch.randn(spec.rank, fan_in, generator=gen) * spec.std
            b = torch.randn(fan_out, spec.rank, generator=gen) * spec.std
            tensors[f"{prefix}.lora_A.weight"] = a.contiguous()
            tensors[f"{prefix}.lora_B.weight"] = b.contiguous()
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": spec.rank,
        "lora_alpha": spec.alpha if spec.alpha is not None else spec.rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(spec.target_modules),
        "fan_in_fan_out": False,
        "inference_mode": True,
        MODE_KEY: AdapterMode(spec.mode).value,
    }
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / WEIGHTS_FILE))
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
    return directory
