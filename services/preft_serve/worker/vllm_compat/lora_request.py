"""What the seams read of a request's adapter: ``LoRARequest.lora_int_id`` and ``lora_path``
(``vllm/lora/request.py``, vLLM 0.32.0).

vLLM carries only the name, the int id and the path of an adapter to the scheduler and the
runner; whether it is prefill-only or applied by the ReFT runtime is read from its
directory (:mod:`preft_serve.worker.adapter_info`), keyed by id and path.
"""

from __future__ import annotations

from typing import Any

from preft_serve.adapters.families import Runtime
from preft_serve.worker.adapter_info import ADAPTER_INFO, AdapterInfo


def adapter_info_of(lora_request: Any) -> AdapterInfo:
    """Mode/type/digest of a ``LoRARequest``'s adapter directory (cached)."""
    return ADAPTER_INFO.get(lora_request.lora_int_id, lora_request.lora_path)


_ADAPTER_KINDS: dict[tuple[int, str], tuple[bool, bool]] = {}


def adapter_kinds(lora_request: Any) -> tuple[bool, bool]:
    """(applied by the ReFT runtime, prefill-only) of a request's adapter: read for every
    request of every step, so memoised as two booleans."""
    key = (lora_request.lora_int_id, lora_request.lora_path)
    kinds = _ADAPTER_KINDS.get(key)
    if kinds is None:
        info = adapter_info_of(lora_request)
        kinds = _ADAPTER_KINDS[key] = (info.runtime is Runtime.REFT, info.prefill_only)
    return kinds
