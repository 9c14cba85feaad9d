"""The ReFT adapter format (docs/adapters.md), shared by the registry's validation and
the worker's loader so both read a config the same way. What differs between ReFT types
(their tensors, how they make an intervention) is in ``preft_serve.common.families``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from preft_serve.common.adapter_format import AdapterFormatError

FIRST, LAST, SHARED = "first", "last", "shared"
PREFILL_POSITIONS = "prefill"
# Each type's tensors per layer part: AdapterFamily.reft_tensors (preft_serve.common.families).
_POSITIONS = re.compile(r"^(?:f(?P<f>\d+)\+l(?P<fl>\d+)|f(?P<fo>\d+)|l(?P<lo>\d+))$")


def parse_positions(positions: object) -> tuple[int, int] | None:
    """``(first_n, last_n)`` for ``f{n}+l{m}``, ``f{n}``, ``l{m}``; None for ``prefill``."""
    if positions == PREFILL_POSITIONS:
        return None
    match = _POSITIONS.match(positions) if isinstance(positions, str) else None
    if match is None:
        raise AdapterFormatError(
            "ReFT config 'positions' must be 'f{n}+l{n}', 'f{n}', 'l{n}' or 'prefill' "
            f"(got {positions!r})"
        )
    groups = match.groupdict()
    first = groups["f"] or groups["fo"] or 0
    last = groups["fl"] or groups["lo"] or 0
    return int(first), int(last)


def shares_weights(config: Mapping[str, Any]) -> bool:
    """One intervention for first and last positions (default true, always for prefill)."""
    return config.get("positions") == PREFILL_POSITIONS or bool(config.get("share_weights", True))


def parts(config: Mapping[str, Any]) -> list[str]:
    """Intervention parts whose tensors a config requires."""
    return [SHARED] if shares_weights(config) else [FIRST, LAST]


def tensor_prefix(layer: int, part: str) -> str:
    return f"layers.{layer}.{part}"


def tensor_name(layer: int, part: str, suffix: str) -> str:
    return f"{tensor_prefix(layer, part)}.{suffix}"
