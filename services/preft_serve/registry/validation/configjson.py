"""Reading ``adapter_config.json``: bounded in size and nesting, finite numbers only.

``json.loads`` alone accepts ``1e309`` (as infinity, which the registry would then store
as the non-JSON token ``Infinity``) and recurses once per nesting level (100,000 ``[``
were a RecursionError). Depth is measured before parsing; every number is checked as it
is parsed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from preft_serve.adapters.format import CONFIG_FILE
from preft_serve.common.jsondepth import json_depth
from preft_serve.common.text import clip
from preft_serve.registry.validation.base import AdapterRejected, UploadBounds


class _NotFinite(ValueError):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not allowed in JSON")


def load_config(path: Path, bounds: UploadBounds) -> dict[str, Any]:
    """Parse adapter_config.json into a JSON object, or raise :class:`AdapterRejected`."""
    size = path.stat().st_size
    if size > bounds.max_config_bytes:
        raise AdapterRejected(
            f"{CONFIG_FILE} is {size} bytes; the limit is {bounds.max_config_bytes}"
        )
    raw = path.read_bytes()
    depth = json_depth(raw)
    if depth > bounds.max_json_depth:
        raise AdapterRejected(
            f"{CONFIG_FILE} nests arrays/objects {depth} levels deep; the "
            f"limit is {bounds.max_json_depth}"
        )
    try:
        config = json.loads(raw, parse_float=_finite_float, parse_constant=_no_constants)
    except _NotFinite as exc:
        raise AdapterRejected(
            f"{CONFIG_FILE} has the number {clip(exc.text, 40)}, which is "
            "not finite as a 64-bit float; every number must be finite"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise AdapterRejected(f"{CONFIG_FILE} is not valid JSON: {clip(str(exc))}") from None
    if not isinstance(config, dict):
        raise AdapterRejected(f"{CONFIG_FILE} must hold a JSON object")
    return config
