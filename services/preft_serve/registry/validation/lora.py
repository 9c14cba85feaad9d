"""LoRA (PEFT ``"peft_type": "LORA"``): config rules and the tensors a config implies.

Tensor names follow PEFT: ``base_model.model.model.layers.{L}.{self_attn|mlp}.{module}.
lora_A.weight`` with shape ``(r, in_features)`` and ``lora_B.weight`` with shape
``(out_features, r)``, for the modules ``target_modules`` resolves to (``targets.py``:
lists, suffixes, regexes and ``all-linear``, as PEFT resolves them). Features the engine
does not apply (DoRA, bias, modules_to_save, per-module ranks, ...) are rejected, each
naming its config key, rather than silently ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from preft_serve.adapters.families.lora import LORA_MODULES
from preft_serve.adapters.format import AdapterType
from preft_serve.common.text import clip, shown
from preft_serve.registry.validation.base import (
    AdapterRejected,
    AdapterValidator,
    BaseModelSpec,
    Shapes,
    UploadBounds,
    is_int,
    register_validator,
    require,
)
from preft_serve.registry.validation.targets import resolve_targets
from preft_serve.registry.validation.weights import WeightsFile

SUPPORTED_MODULES = LORA_MODULES
_PREFIX = "base_model.model"
# PEFT LoraConfig settings that change what the adapter computes and that the workers do
# not implement: key -> why (and what to do). Refused when set to anything but the default.
_UNSUPPORTED: dict[str, str] = {
    "use_dora": "DoRA adapters (use_dora=true) are not supported; train a plain LoRA adapter",
    "lora_bias": "lora_bias=true (a trained bias on lora_B) is not supported; train with "
    "lora_bias=false",
    "modules_to_save": "modules_to_save is not supported (it would replace base-model "
    "weights); train without it",
    "fan_in_fan_out": "fan_in_fan_out=true is not supported (Conv1D models such as GPT-2)",
    "rank_pattern": "per-module rank_pattern is not supported; use one r and lora_alpha for "
    "all modules",
    "alpha_pattern": "per-module alpha_pattern is not supported; use one r and lora_alpha for "
    "all modules",
    "use_qalora": "QALoRA (use_qalora=true) is not supported",
    "use_bdlora": "block-diagonal LoRA (use_bdlora) is not supported",
    "alora_invocation_tokens": "Activated LoRA (alora_invocation_tokens) is not supported",
    "layer_replication": "layer_replication is not supported (it changes the base model's layers)",
    "target_parameters": "target_parameters (LoRA on parameters, e.g. MoE experts) is not "
    "supported; use target_modules",
    "trainable_token_indices": "trainable_token_indices (trained embedding rows) is not "
    "supported; train without it",
    "arrow_config": "Arrow routing (arrow_config) is not supported",
    "kasa_config": "KaSA (kasa_config) is not supported",
    "velora_config": "VeLoRA (velora_config) is not supported",
    "monteclora_config": "MonteCLoRA (monteclora_config) is not supported",
}
# init_lora_weights values after which PEFT changes the base weights when it loads the
# adapter (PiSSA, OLoRA, CorDA, LoftQ): served on the unchanged base model they are wrong.
_BASE_CHANGING_INITS = ("pissa", "olora", "corda", "loftq")


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


def _check_scale(config: Mapping[str, Any], alpha: float, bounds: UploadBounds) -> None:
    what, divisor = _scale_divisor(config)
    max_alpha = bounds.max_lora_scale * divisor
    if alpha <= max_alpha:  # exact for ints of any size
        return
    try:
        scale = f"{alpha / divisor:.3g}"
    except OverflowError:
        scale = "inf"
    raise AdapterRejected(
        f"LoRA scale lora_alpha / {what} = {scale} (lora_alpha={shown(alpha, 30)}, "
        f"r={config['r']}) is over the limit of {bounds.max_lora_scale:g}; use lora_alpha "
        f"<= {math.floor(max_alpha)}"
    )


@register_validator
class LoraValidator(AdapterValidator):
    type = AdapterType.LORA

    def check_config(
        self, config: Mapping[str, Any], base: BaseModelSpec, bounds: UploadBounds
    ) -> int:
        rank = config.get("r")
        if not (is_int(rank) and rank >= 1):
            raise AdapterRejected(f"LoRA config 'r' must be a positive integer (got {shown(rank)})")
        limit = bounds.max_lora_rank
        require(
            rank <= limit,
            f"LoRA rank r={rank} exceeds the largest rank this deployment's "
            f"workers serve ({limit}); retrain with r <= {limit}, or have the operator raise "
            "MAX_LORA_RANK on workers and registry together (Helm: worker.maxLoraRank)",
        )
        alpha = config.get("lora_alpha", rank)
        require(
            (is_int(alpha) or isinstance(alpha, float)) and alpha > 0,
            f"LoRA config 'lora_alpha' must be a positive number (got {shown(alpha)})",
        )
        require(
            isinstance(config.get("use_rslora", False), bool),
            "LoRA config 'use_rslora' must be true or false",
        )
        _check_scale(config, alpha, bounds)
        require(
            config.get("bias", "none") == "none",
            f"LoRA bias={shown(config.get('bias'))} is not supported; train with bias='none'",
        )
        for key, why in _UNSUPPORTED.items():
            if config.get(key):
                raise AdapterRejected(
                    f"adapter_config.json sets {key}={clip(json.dumps(config[key]), 40)}: {why}"
                )
        init = config.get("init_lora_weights", True)
        require(
            not (isinstance(init, str) and init.lower().startswith(_BASE_CHANGING_INITS)),
            f"init_lora_weights={shown(init, 40)} changes the base model's weights when PEFT "
            "loads the adapter, which the shared base model cannot do; convert it to a plain "
            "LoRA with PEFT's path_initial_model_for_weight_conversion",
        )
        layers = config.get("layers_to_transform")
        if layers is not None:
            as_list = [layers] if is_int(layers) else layers
            require(
                isinstance(as_list, list)
                and bool(as_list)
                and all(is_int(x) and 0 <= x < base.num_layers for x in as_list),
                f"layers_to_transform must list layer indices in 0..{base.num_layers - 1} "
                f"(the base model has {base.num_layers} layers; got {shown(layers)})",
            )
        resolve_targets(config, base)  # raises when target_modules cannot be served
        return rank

    def config_warnings(self, config: Mapping[str, Any], base: BaseModelSpec) -> list[str]:
        return resolve_targets(config, base).warnings

    def expected_tensors(self, config: Mapping[str, Any], base: BaseModelSpec) -> Shapes:
        rank = int(config["r"])
        shapes: Shapes = {}
        for target in resolve_targets(config, base).targets:
            fan_in, fan_out = module_features(base, target.module)
            prefix = f"{_PREFIX}.{target.path}"
            shapes[f"{prefix}.lora_A.weight"] = (rank, fan_in)
            shapes[f"{prefix}.lora_B.weight"] = (fan_out, rank)
        return shapes

    def check_values(
        self, config: Mapping[str, Any], weights: WeightsFile, bounds: UploadBounds
    ) -> list[str]:
        """Bound the update scale·B·A: no element can exceed scale·r·max|A|·max|B|."""
        rank, scale = int(config["r"]), lora_scale(config)
        problems = []
        for a_name in sorted(n for n in weights.tensors if n.endswith(".lora_A.weight")):
            prefix = a_name.removesuffix(".lora_A.weight")
            max_a = weights.max_abs(a_name)
            max_b = weights.max_abs(f"{prefix}.lora_B.weight")
            bound = scale * rank * max_a * max_b
            if bound > bounds.max_lora_update:
                problems.append(
                    f"LoRA {prefix} can change a base weight by up to {bound:.3g} (scale "
                    f"{scale:.3g} x r {rank} x max|lora_A| {max_a:.3g} x max|lora_B| "
                    f"{max_b:.3g}); the limit is {bounds.max_lora_update:.3g} - such an "
                    "update only produces inf/NaN: check the training run or lower lora_alpha"
                )
        return problems
