"""Seam 4, prefix-cache keys: ``vllm/v1/core/kv_cache_utils.py`` (vLLM 0.32.0).

Relies on ``_gen_lora_extra_hash_keys(request)`` and
``generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx)``
being looked up as module globals by the block hasher, so replacing them there changes
every block's key. Keys are by the adapter's content digest instead of its name and path,
and blocks of prefill-only adapters that reach past the prompt are also keyed on the
prompt length. A request whose adapter boundary ends the adapter inside its prompt is keyed as
if its prompt ended there (its later prompt tokens' KV is base-model KV, as decoded tokens'
is), so it never shares a block with one whose adapter covered those tokens, nor the
reverse; a boundary at the prompt's end keys blocks as no boundary does.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core import kv_cache_utils

from preft_serve.worker.vllm_compat.lora_request import adapter_end_of, adapter_info_of

_STOCK_BLOCK_EXTRA_KEYS = kv_cache_utils.generate_block_hash_extra_keys


def _block_extra_keys_with_phase(
    request: Any, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """Stock extra keys plus what makes a prefill-only adapter's KV differ per block.

    A prefill-only adapter's KV for a token depends on whether the token was a prompt token
    (adapted) or a decoded one (base model). A block made purely of prompt tokens is valid
    for any request whose prompt starts with those tokens; a block that reaches past the
    prompt is valid only for the same prompt length (else a follow-up turn whose prompt
    contains the previous reply would reuse base-model KV for adapted tokens). Adapters
    whose prompt KV depends on the prompt length (ReFT at f/l positions) key every block on it.
    """
    keys, next_mm_idx = _STOCK_BLOCK_EXTRA_KEYS(
        request, start_token_idx, end_token_idx, start_mm_idx
    )
    lora_request = request.lora_request
    if lora_request is None:
        return keys, next_mm_idx
    info = adapter_info_of(lora_request)
    prompt_len = adapter_end_of(request)  # the request's boundary, when before the prompt's end
    if info.prompt_length_dependent:
        extra: tuple[Any, ...] = (("prompt_len", prompt_len),)
    elif info.prefill_only and end_token_idx > prompt_len:
        extra = (("decoded_after", prompt_len),)
    else:
        return keys, next_mm_idx
    return (keys or ()) + extra, next_mm_idx


def _lora_extra_hash_keys_by_content(request: Any) -> list[tuple[str, str]]:
    """Key prompt KV by adapter content, not by name/path as stock vLLM does: a new version
    under an old name or path never reuses stale KV, and identical content shares blocks."""
    if request.lora_request is None:
        return []
    return [("adapter_sha256", adapter_info_of(request.lora_request).digest)]


def install() -> None:
    """Replace vLLM's block-key functions with the content- and phase-aware ones."""
    # vLLM types its LoRA keys as (str, str, str) tuples but only hashes them (ours are
    # pairs): patched through an untyped handle.
    kv_utils: Any = kv_cache_utils
    kv_utils._gen_lora_extra_hash_keys = _lora_extra_hash_keys_by_content
    kv_utils.generate_block_hash_extra_keys = _block_extra_keys_with_phase
