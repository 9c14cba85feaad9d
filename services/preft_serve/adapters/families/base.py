"""What every part of the system needs to know about one adapter type, declared once.

An :class:`AdapterFamily` says how the worker applies a type (:class:`Runtime`), which
config marks it, and, for ReFT types, its tensors and how they make an intervention. The
registry's validators and the worker's runtime both look types up here instead of treating
"not LoRA" as ReFT. Adding a type: see docs/adapters.md ("Adding an adapter type").
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Any

from preft_serve.adapters.format import AdapterFormatError, AdapterType


class Runtime(str, enum.Enum):
    """What applies a type's adapters in the worker."""

    LORA = "lora"  # vLLM's LoRA manager and kernels (adapter slots), with PreFT mapping
    REFT = "reft"  # preft_serve.worker.reft: interventions on the residual stream


Tensors = Mapping[str, Any]  # one layer part's tensors by suffix (torch or numpy)
Intervention = tuple[Any, Any, Any]  # (proj_in (r, d), bias (r,), proj_out (r, d))


@dataclasses.dataclass(frozen=True)
class AdapterFamily:
    """One adapter type.

    ReFT types describe their weights per layer part (``layers.{L}.{P}.{suffix}``) in
    ``reft_tensors`` and turn them into the one op the kernels run,
    ``delta = (h @ proj_in.T + bias) @ proj_out`` (see ``preft_kernels.reft``), with
    ``intervention``.
    """

    type: AdapterType
    label: str  # how messages name it ("LoRA", "DiReFT" ...)
    runtime: Runtime
    peft_type: str  # adapter_config.json "peft_type" ("LORA", "REFT"); ReFT types are
    # told apart by "reft_type" (their type value)
    prompt_only: bool = False  # never applied to decode tokens, whatever preft_mode says
    reft_tensors: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """ReFT: tensor suffix -> shape kind, "rd" (rank x hidden) or "r" (rank)."""
    orthonormal_rows: tuple[str, ...] = ()  # ReFT: suffixes whose rows must be orthonormal
    intervention: Callable[[Tensors], Intervention] | None = None  # ReFT


_FAMILIES: dict[AdapterType, AdapterFamily] = {}


def register_family(family: AdapterFamily) -> AdapterFamily:
    """Make ``family`` known to the registry's validation and the worker."""
    if family.runtime is Runtime.REFT and (not family.reft_tensors or family.intervention is None):
        raise ValueError(f"ReFT family {family.type.value} needs reft_tensors and intervention")
    _FAMILIES[family.type] = family
    return family


def family_of(adapter_type: AdapterType) -> AdapterFamily:
    """The family of a type; an unknown one raises with the list of known types."""
    try:
        return _FAMILIES[adapter_type]
    except KeyError:
        valid = ", ".join(f.type.value for f in families())
        raise AdapterFormatError(
            f"adapter type {adapter_type!r} has no family; known: {valid}"
        ) from None


def families(runtime: Runtime | None = None) -> list[AdapterFamily]:
    """Registered families (of one runtime), in type-name order."""
    return sorted(
        (f for f in _FAMILIES.values() if runtime is None or f.runtime is runtime),
        key=lambda f: f.type.value,
    )
