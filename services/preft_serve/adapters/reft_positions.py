"""Which prompt positions a ReFT adapter intervenes on (pyreft's rule).

``f{n}+l{m}``: with prompt length ``P``, ``first = min(P // 2, n)`` and
``last = min(P // 2, m)``; the first ``first`` and last ``last`` positions are intervened
(pyreft's ``get_intervention_locations``; its padding entries intervene nowhere), so the
two sets never overlap. ``f{n}`` / ``l{m}`` use one side; ``prefill`` is every prompt token.
"""

from __future__ import annotations

import numpy as np

from preft_serve.adapters.reft_format import FIRST, LAST, SHARED, parse_positions

__all__ = ["FIRST", "LAST", "SHARED", "first_last", "parse_positions", "part_codes"]
NONE = -1  # part code: no intervention
PART_CODES = {FIRST: 0, LAST: 1}


def first_last(prompt_len: int, spec: tuple[int, int]) -> tuple[int, int]:
    """pyreft's truncation of first/last-n for short prompts."""
    first_n, last_n = spec
    return min(prompt_len // 2, first_n), min(prompt_len // 2, last_n)


def part_codes(positions: np.ndarray, prompt_len: int, spec: tuple[int, int] | None) -> np.ndarray:
    """Per absolute position: 0 = first, 1 = last, -1 = none (decode tokens are always -1).

    With ``spec`` None (``prefill``), every prompt position is 0 (one shared intervention).
    """
    positions = np.asarray(positions, dtype=np.int64)
    in_prompt = positions < prompt_len
    if spec is None:
        return np.where(in_prompt, 0, NONE)
    first, last = first_last(prompt_len, spec)
    codes = np.full(positions.shape, NONE, dtype=np.int64)
    codes[in_prompt & (positions >= prompt_len - last)] = PART_CODES[LAST]
    codes[in_prompt & (positions < first)] = PART_CODES[FIRST]
    return codes
