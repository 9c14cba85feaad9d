"""Deterministic tiny random-init models and adapters (no model hub needed).

Used by the tests, the demo stack and the benchmarks. ``python -m preft_serve.toymodels
--help`` generates them from the command line.
"""

from preft_serve.toymodels.adapters import LoraSpec, make_lora_adapter
from preft_serve.toymodels.base_models import PRESETS, ModelPreset, make_model
from preft_serve.toymodels.reft import ReftSpec, make_reft_adapter

__all__ = [
    "PRESETS",
    "LoraSpec",
    "ModelPreset",
    "ReftSpec",
    "make_lora_adapter",
    "make_model",
    "make_reft_adapter",
]
