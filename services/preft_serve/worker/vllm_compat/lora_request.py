"""What the seams read of a request's adapter: ``LoRARequest.lora_int_id`` and ``lora_path``
(``vllm/lora/request.py``, vLLM 0.32.0).

vLLM carries only the name, the int id and the path of an adapter to the scheduler and the
runner; whether it is prefill-only or applied by the ReFT runtime is read from its
directory (:mod:`preft_serve.worker.adapter_info`), keyed by id and path. Where a
request's adapter stops is read from its ``SamplingParams.extra_args``
(:mod:`preft_serve.common.adapter_boundary`), and whose request it is from the same
(:mod:`preft_serve.common.tenant_xarg`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from preft_serve.adapters.families import Runtime
from preft_serve.common.adapter_boundary import adapter_boundary
from preft_serve.common.tenant_xarg import tenant_of
from preft_serve.worker.adapter_info import ADAPTER_INFO, AdapterInfo
from preft_serve.worker.token_mapping import adapter_end


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


def adapter_end_of(request: Any) -> int:
    """Where a request's prefill-only adapter stops (:func:`token_mapping.adapter_end`):
    its prompt's length, or the boundary in its ``SamplingParams.extra_args``. Reads
    ``num_prompt_tokens`` and ``sampling_params``, which the scheduler's ``Request`` and the
    runner's ``CachedRequestState`` both have (``vllm/v1/request.py``,
    ``vllm/v1/worker/gpu_input_batch.py``)."""
    params = request.sampling_params
    boundary = adapter_boundary(params.extra_args) if params is not None else None
    return adapter_end(int(request.num_prompt_tokens), boundary)


def tenant_of_request(request: Any) -> str | None:
    """The tenant the gateway named in a scheduler ``Request``'s ``sampling_params``."""
    params = request.sampling_params
    return tenant_of(params.extra_args) if params is not None else None


def adapter_ends(
    requests: dict[str, Any], req_ids: list[str], num_prompt: np.ndarray, rows: np.ndarray
) -> np.ndarray:
    """Per batch row, where its adapter stops: ``num_prompt`` (itself, when no request of
    ``rows``, the rows with an adapter, sets a boundary) with each boundary applied."""
    ends = num_prompt
    for row in np.flatnonzero(rows).tolist():
        state = requests.get(req_ids[row])
        if state is None:
            continue
        end = adapter_end_of(state)
        if end < ends[row]:
            if ends is num_prompt:
                ends = num_prompt.copy()
            ends[row] = end
    return ends
