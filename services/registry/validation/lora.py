"""LoRA (PEFT ``"peft_type": "LORA"``): config rules and the tensors a config implies.

Tensor names follow PEFT: ``base_model.model.model.layers.{L}.{self_attn|mlp}.{module}.
lora_A.weight`` with shape ``(r, in_features)`` and ``lora_B.weight`` with shape
``(out_features, r)``. Features the engine does not apply (DoRA, bias, modules_to_save,
per-module ranks) are rejected rather than silently ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from preft_serve.common.adapter_format import AdapterType
from preft_serve.registry.text import shown
from preft_serve.registry.validation.base import (
    AdapterRejected,
    AdapterValidator,
    BaseModelSpec,
    Shapes,
    ValidationLimits,
    is_int,
    register_validator,
    require,
)
from preft_serve.registry.validation.weights import WeightsFile

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
SUPPORTED_MODULES = ATTENTION + MLP
_PREFIX = "base_model.model.model.layers"


def module_features(base: BaseModelSpec, module: str) -> tuple[int, int]:
    """(in_features, out_features) of a decoder projection."""
    q = base.num_heads * base.head_dim
    kv = base.num_kv_heads * base.head_dim
    return {
        "q_proj": (base.hidden_size, q),
        "k_proj": (base.hidden_size, kv),
        "v_proj": (base.hidden_size, kv),
        "o_proj": (q, base.hidden_size),
        "gate_proj": (base.hidden_size, base.intermediate_size),
        "up_proj": (base.hidden_size, base.intermediate_size),
        "down_proj": (base.intermediate_size, base.hidden_size),
    }[module]


def _scale_divisor(config: Mapping[str, Any]) -> tuple[str, float]:
    """How PEFT turns lora_alpha into the update's scale: alpha / r, or alpha / sqrt(r)."""
    rank = int(config["r"])
    if config.get("use_rslora", False):
        return "sqrt(r)", math.sqrt(rank)
    return "r", float(rank)


def lora_scale(config: Mapping[str, Any]) -> float:
    """The factor PEFT multiplies B·A by (checked finite and bounded by check_config)."""
    _, divisor = _scale_divisor(config)
    return float(config.get("lora_alpha", config["r"])) / divisor


def _check_scale(config: Mapping[str, Any], alpha: float, limits: ValidationLimits) -> None:
    what, divisor = _scale_divisor(config)
    max_alpha = limits.max_lora_scale * divisor
    if alpha <= max_alpha:  # exact for ints of any size
        return
    try:
        scale = f"{alpha / divisor:.3g}"
    except OverflowError:
        scale = "inf"
    raise AdapterRejected(
        f"LoRA scale lora_alpha / {what} = {scale} (lora_alpha={shown(alpha, 30)}, "
        f"r={config['r']}) is over the limit of {limits.max_lora_scale:g}; use lora_alpha "
        f"<= {math.floor(max_alpha)}")


def _layers(config: Mapping[str, Any], base: BaseModelSpec) -> list[int]:
    chosen = config.get("layers_to_transform")
    if chosen is None:
        return list(range(base.num_layers))
    return [chosen] if is_int(chosen) else list(chosen)


@register_validator
class LoraValidator(AdapterValidator):
    type = AdapterType.LORA

    def check_config(
        self, config: Mapping[str, Any], base: BaseModelSpec, limits: ValidationLimits
    ) -> int:
        rank = config.get("r")
        if not (is_int(rank) and rank >= 1):
            raise AdapterRejected(f"LoRA config 'r' must be a positive integer "
                                  f"(got {shown(rank)})")
        limit = limits.max_lora_rank
        require(rank <= limit, f"LoRA rank r={rank} exceeds the largest rank this deployment's "
                f"workers serve ({limit}); retrain with r <= {limit}, or have the operator raise "
                "MAX_LORA_RANK on workers and registry together (Helm: worker.maxLoraRank)")
        alpha = config.get("lora_alpha", rank)
        require((is_int(alpha) or isinstance(alpha, float)) and alpha > 0,
                f"LoRA config 'lora_alpha' must be a positive number (got {shown(alpha)})")
        require(isinstance(config.get("use_rslora", False), bool),
                "LoRA config 'use_rslora' must be true or false")
        _check_scale(config, alpha, limits)
        modules = config.get("target_modules")
        if not (isinstance(modules, list) and modules
                and all(isinstance(m, str) for m in modules)):
            raise AdapterRejected(
                "LoRA config 'target_modules' must be a non-empty list of module names "
                f"from: {', '.join(SUPPORTED_MODULES)} (got {shown(modules)})")
        unknown = sorted(set(modules) - set(SUPPORTED_MODULES))
        require(not unknown, f"LoRA target_modules {shown(unknown)} are not supported; use only: "
                f"{', '.join(SUPPORTED_MODULES)}")
        require(not config.get("use_dora"), "DoRA adapters (use_dora=true) are not supported; "
                "train a plain LoRA adapter")
        require(config.get("bias", "none") == "none", f"LoRA bias={shown(config.get('bias'))} is "
                "not supported; train with bias='none'")
        require(not config.get("modules_to_save"), "modules_to_save is not supported (it would "
                "replace base-model weights); train without it")
        require(not config.get("fan_in_fan_out"), "fan_in_fan_out=true is not supported")
        for key in ("rank_pattern", "alpha_pattern"):
            require(not config.get(key), f"per-module {key} is not supported; use one r and "
                    "lora_alpha for all modules")
        layers = config.get("layers_to_transform")
        if layers is not None:
            as_list = [layers] if is_int(layers) else layers
            require(
                isinstance(as_list, list) and bool(as_list)
                and all(is_int(x) and 0 <= x < base.num_layers for x in as_list),
                f"layers_to_transform must list layer indices in 0..{base.num_layers - 1} "
                f"(the base model has {base.num_layers} layers; got {shown(layers)})",
            )
        return rank

    def expected_tensors(self, config: Mapping[str, Any], base: BaseModelSpec) -> Shapes:
        rank = int(config["r"])
        shapes: Shapes = {}
        for layer in _layers(config, base):
            for module in dict.fromkeys(config["target_modules"]):
                group = "self_attn" if module in ATTENTION else "mlp"
                fan_in, fan_out = module_features(base, module)
                prefix = f"{_PREFIX}.{layer}.{group}.{module}"
                shapes[f"{prefix}.lora_A.weight"] = (rank, fan_in)
                shapes[f"{prefix}.lora_B.weight"] = (fan_out, rank)
        return shapes

    def check_values(
        self, config: Mapping[str, Any], weights: WeightsFile, limits: ValidationLimits
    ) -> list[str]:
        """Bound the update scale·B·A: no element can exceed scale·r·max|A|·max|B|."""
        rank, scale = int(config["r"]), lora_scale(config)
        problems = []
        for a_name in sorted(n for n in weights.tensors if n.endswith(".lora_A.weight")):
            prefix = a_name.removesuffix(".lora_A.weight")
            max_a = weights.max_abs(a_name)
            max_b = weights.max_abs(f"{prefix}.lora_B.weight")
            bound = scale * rank * max_a * max_b
            if bound > limits.max_lora_update:
                problems.append(
                    f"LoRA {prefix} can change a base weight by up to {bound:.3g} (scale "
                    f"{scale:.3g} x r {rank} x max|lora_A| {max_a:.3g} x max|lora_B| "
                    f"{max_b:.3g}); the limit is {limits.max_lora_update:.3g} - such an "
                    "update only produces inf/NaN: check the training run or lower lora_alpha")
        return problems
