"""DiReFT: ``h + W2ᵀ(W1·h + b)`` (``"reft_type": "direft"``)."""

from preft_serve.common.adapter_format import AdapterType
from preft_serve.common.families.base import (
    AdapterFamily,
    Intervention,
    Runtime,
    Tensors,
    register_family,
)


def _intervention(t: Tensors) -> Intervention:
    return t["w1"], t["b"], t["w2"]


DIREFT = register_family(AdapterFamily(
    AdapterType.DIREFT, "DiReFT", Runtime.REFT, peft_type="REFT", prompt_only=True,
    reft_tensors={"w1": "rd", "b": "r", "w2": "rd"}, intervention=_intervention))
