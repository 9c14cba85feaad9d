"""The adapter boundary: how many leading tokens of a request get its prefill-only adapter.

A request may carry ``vllm_xargs: {"preft_adapter_tokens": b}``: tokens ``[0, b)`` run with
the adapter, tokens from ``b`` on run on the base model while attending to the adapted KV
(PreFT teacher forcing: score an expected answer appended to the prompt). Absent, the
boundary is the prompt's length. Only the gateway sets it (its evaluation gate); clients
cannot (``gateway/validation.py``). Shared by the gateway, which sends it, and the worker,
which reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ADAPTER_TOKENS_XARG = "preft_adapter_tokens"


def adapter_boundary(extra_args: Mapping[str, Any] | None) -> int | None:
    """The boundary a request's extra arguments set, or None (a missing or malformed value:
    the worker then applies the adapter to the whole prompt, as without it)."""
    if not extra_args:
        return None
    value = extra_args.get(ADAPTER_TOKENS_XARG)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
