"""LoReFT: ``h + Rᵀ(W·h + b − R·h)`` with orthonormal rows in R (``"reft_type": "loreft"``)."""

from preft_serve.adapters.families.base import AdapterFamily, Runtime, register_family
from preft_serve.adapters.format import AdapterType

LOREFT = register_family(
    AdapterFamily(
        AdapterType.LOREFT,
        "LoReFT",
        Runtime.REFT,
        peft_type="REFT",
        prompt_only=True,
        reft_tensors={"r": "rd", "w": "rd", "b": "r"},
        orthonormal_rows=("r",),
        intervention=lambda t: (t["w"] - t["r"], t["b"], t["r"]),
    )
)
