"""preft-serve adapter kernels (import name ``preft_kernels``).

* :mod:`preft_kernels.lora_grouped` — CPU grouped (segment-per-adapter) LoRA: one matmul
  per adapter group instead of vLLM's per-token weight gather.
* :mod:`preft_kernels.reft` — grouped low-rank ReFT interventions (DiReFT, LoReFT).
* :mod:`preft_kernels.reference` — float64 references every kernel is tested against.
"""

from preft_kernels.lora_grouped import (
    AdapterGroups,
    NonzeroSlots,
    fuse_lora_a_buffers,
    fused_lora_a,
    grouped_lora_expand,
    grouped_lora_linear,
    grouped_lora_shrink,
)
from preft_kernels.reft import ReftGroup, grouped_reft

__all__ = [
    "AdapterGroups",
    "NonzeroSlots",
    "ReftGroup",
    "fuse_lora_a_buffers",
    "fused_lora_a",
    "grouped_lora_expand",
    "grouped_lora_linear",
    "grouped_lora_shrink",
    "grouped_reft",
]
