"""The ReFT adapter format (docs/adapters.md), shared by the registry's validation and
the worker's loader so both read a config the same way. What differs between ReFT types
(their tensors, how they make an intervention) is in ``preft_serve.adapters.families``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from preft_serve.adapters.format import AdapterFormatError
from preft_serve.common.text import shown

FIRST, LAST, SHARED = "first", "last", "shared"
PREFILL_POSITIONS = "prefill"
# Each type's tensors per layer part: AdapterFamily.reft_tensors (preft_serve.adapters.families).
# At most 6 digits a count: int() of a longer digit string is work a tenant should not
# choose (and past 4,300 digits a ValueError).
_POSITIONS = re.compile(
    r"^(?:f(?P<f>\d{1,6})\+l(?P<fl>\d{1,6})|f(?P<fo>\d{1,6})|l(?P<lo>\d{1,6}))$"
)


def parse_positions(positions: object) -> tuple[int, int] | None:
    """``(first_n, last_n)`` for ``f{n}+l{m}``, ``f{n}``, ``l{m}``; None for ``prefill``."""
    if positions == PREFILL_POSITIONS:
        return None
    match = _POSITIONS.match(positions) if isinstance(positions, str) else None
    if match is None:
        raise AdapterFormatError(
            "ReFT config 'positions' must be 'f{n}+l{n}', 'f{n}', 'l{n}' or 'prefill' "
            f"with n of at most 6 digits (got {shown(positions)})"
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
