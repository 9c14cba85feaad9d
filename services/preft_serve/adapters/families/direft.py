"""DiReFT: ``h + W2ᵀ(W1·h + b)`` (``"reft_type": "direft"``)."""

from preft_serve.adapters.families.base import AdapterFamily, Runtime, register_family
from preft_serve.adapters.format import AdapterType

DIREFT = register_family(
    AdapterFamily(
        AdapterType.DIREFT,
        "DiReFT",
        Runtime.REFT,
        peft_type="REFT",
        prompt_only=True,
        reft_tensors={"w1": "rd", "b": "r", "w2": "rd"},
        intervention=lambda t: (t["w1"], t["b"], t["w2"]),
    )
)
