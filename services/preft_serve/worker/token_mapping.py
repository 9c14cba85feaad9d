"""Which tokens of a step get which adapter: the heart of PreFT, free of vLLM types.

For a request with a ``prefill``-mode adapter, a token at position ``p`` gets the adapter iff
``p < num_prompt_tokens``: every prompt token, including the last one (whose logits sample
the first output token), in whatever chunks the scheduler splits the prompt into, and also
when a preempted request recomputes its prompt. Tokens at ``p >= num_prompt_tokens`` are
decode tokens and run on the base model. ``all``-mode adapters apply to every token.

A request may end its adapter earlier, at a boundary ``b`` inside its prompt
(:mod:`preft_serve.common.adapter_boundary`): the seams then pass
:func:`adapter_end` (``min(prompt length, b)``) wherever they would pass the prompt
length, and prompt tokens from ``b`` on are treated exactly as decode tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np

NO_ADAPTER = 0


@dataclasses.dataclass(frozen=True)
class StepMapping:
    """Adapter id per scheduled token and per sampled token (0 = base model)."""

    token_ids: np.ndarray  # (sum(num_scheduled),)
    sampled_ids: np.ndarray  # (sum(num_sampled),)

    def active_ids(self) -> set[int]:
        """Adapter ids that need a slot in this step."""
        ids = np.union1d(self.token_ids, self.sampled_ids)
        return {int(i) for i in ids if i != NO_ADAPTER}


def _positions(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row (request index, absolute position) for ``counts[i]`` rows from ``starts[i]``."""
    req = np.repeat(np.arange(counts.size), counts)
    first_row = np.repeat(np.cumsum(counts) - counts, counts)
    pos = np.repeat(starts, counts) + (np.arange(req.size) - first_row)
    return req, pos


def step_mapping(
    adapter_ids: np.ndarray,  # (num_reqs,) adapter id per request, 0 = none
    prefill_only: np.ndarray,  # (num_reqs,) bool: adapter mode is "prefill"
    num_computed: np.ndarray,  # (num_reqs,) tokens already in the KV cache
    num_prompt: np.ndarray,  # (num_reqs,) prompt length
    num_scheduled: np.ndarray,  # (num_reqs,) tokens computed in this step
    num_sampled: np.ndarray,  # (num_reqs,) tokens sampled (the last num_sampled scheduled)
) -> StepMapping:
    """Map every scheduled and sampled token of a step to an adapter id."""
    adapter_ids = np.asarray(adapter_ids, dtype=np.int64)
    prefill_only = np.asarray(prefill_only, dtype=bool)
    num_prompt = np.asarray(num_prompt, dtype=np.int64)
    num_computed = np.asarray(num_computed, dtype=np.int64)
    num_scheduled = np.asarray(num_scheduled, dtype=np.int64)
    num_sampled = np.asarray(num_sampled, dtype=np.int64)

    def ids_at(req: np.ndarray, pos: np.ndarray) -> np.ndarray:
        applies = ~prefill_only[req] | (pos < num_prompt[req])
        return np.where(applies, adapter_ids[req], NO_ADAPTER)

    token_ids = ids_at(*_positions(num_computed, num_scheduled))
    sample_start = num_computed + num_scheduled - num_sampled
    sampled_ids = ids_at(*_positions(sample_start, num_sampled))
    return StepMapping(token_ids, sampled_ids)


def adapter_end(num_prompt: int, boundary: int | None) -> int:
    """Where a prefill-only adapter stops: the prompt's end, or the request's boundary
    when that comes first."""
    return num_prompt if boundary is None else min(num_prompt, boundary)


def in_prompt_phase(num_computed: int, num_prompt: int) -> bool:
    """A request still needs its adapter while any prompt token is uncomputed."""
    return num_computed < num_prompt
