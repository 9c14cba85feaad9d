"""How deeply a JSON text nests arrays and objects, found without parsing it.

``json.loads`` recurses once per ``[`` or ``{``: 100,000 of them raise RecursionError
(a 500 with a stack trace). The registry (request bodies, ``adapter_config.json``), the
gateway (completion requests) and the trainer (JSONL lines) measure the depth first, in
linear time and at C speed, and refuse deep documents with a message instead:

1. drop the escape pairs ``\\\\`` and ``\\"``, left to right (inside a string each is one
   character of it; outside one the text is invalid JSON there, and the parser stops
   before going deeper);
2. drop every string (``"..."``, now free of escaped quotes);
3. keep only the brackets and take the maximum running depth.

An unterminated string leaves its brackets in, so the answer errs on the deep side.
"""

from __future__ import annotations

import re

import numpy as np

_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = np.zeros(256, dtype=np.int8)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


def json_depth(data: bytes | str) -> int:
    """Deepest nesting of arrays/objects in ``data`` (0 for a scalar or empty text)."""
    if isinstance(data, str):
        data = data.encode()  # UTF-8 adds no brackets, quotes or backslashes
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = _STRING.sub(b"", unescaped).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    steps = _STEP[np.frombuffer(brackets, dtype=np.uint8)]
    return max(int(np.cumsum(steps, dtype=np.int64).max()), 0)


def json_nests_deeper(data: bytes | str, limit: int) -> bool:
    """Whether ``data`` nests arrays/objects more than ``limit`` levels deep (a body with
    at most ``limit`` brackets is answered without measuring it)."""
    raw = data.encode() if isinstance(data, str) else data
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    return json_depth(raw) > limit
