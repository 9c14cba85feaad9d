"""LoRA (PEFT ``"peft_type": "LORA"``), applied by vLLM's own LoRA machinery."""

from preft_serve.common.adapter_format import AdapterType
from preft_serve.common.families.base import AdapterFamily, Runtime, register_family

LORA = register_family(AdapterFamily(AdapterType.LORA, "LoRA", Runtime.LORA, peft_type="LORA"))
