"""Adapter families: one declaration per adapter type (``base.py``), one module per type.

Importing this package registers the built-in types (LoRA, DiReFT, LoReFT).
"""

from preft_serve.adapters.families import direft, lora, loreft  # noqa: F401  (register)
from preft_serve.adapters.families.base import (
    AdapterFamily,
    Intervention,
    Runtime,
    Tensors,
    families,
    family_of,
    register_family,
)

__all__ = [
    "AdapterFamily",
    "Intervention",
    "Runtime",
    "Tensors",
    "families",
    "family_of",
    "register_family",
]
