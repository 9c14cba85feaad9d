"""LoRA (PEFT ``"peft_type": "LORA"``), applied by vLLM's own LoRA machinery.

The decoder projections a LoRA adapter may target are declared here once: the registry's
validation, training (``preft train --target-modules``) and the test generators read them.
They are the Hugging Face module names of Llama-style decoders (Llama, Qwen2, Mistral,
SmolLM2): ``model.layers.{L}.self_attn.{q,k,v,o}_proj`` and ``model.layers.{L}.mlp.
{gate,up,down}_proj``. vLLM fuses some of them (``PACKED_MODULES``) and splits PEFT's
per-projection tensors itself; an adapter names them separately.
"""

from preft_serve.adapters.families.base import AdapterFamily, Runtime, register_family
from preft_serve.adapters.format import AdapterType

LORA = register_family(AdapterFamily(AdapterType.LORA, "LoRA", Runtime.LORA, peft_type="LORA"))

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")  # under self_attn
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")  # under mlp
LORA_MODULES = ATTENTION_MODULES + MLP_MODULES
# vLLM's fused projections for these architectures (its packed_modules_mapping): names an
# adapter trained with Hugging Face modules never contains.
PACKED_MODULES = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def module_group(module: str) -> str:
    """The block a projection lives in: ``self_attn`` or ``mlp``."""
    return "self_attn" if module in ATTENTION_MODULES else "mlp"
