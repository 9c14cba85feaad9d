"""vLLM accepts only a fixed set of ``max_lora_rank`` values; the benchmarks and the quality
study round an adapter's rank up to one (a rank-4 adapter on a ``max_lora_rank=4`` engine
is refused by vLLM's config validation)."""

from __future__ import annotations

from typing import get_args

import pytest
from vllm.config.lora import LoRAConfig, MaxLoRARanks

from preft_serve.worker.vllm_compat.engine_args import engine_max_lora_rank


@pytest.mark.parametrize("rank", [1, 2, 4, 8, 9, 16, 33, 64, 300, 512])
def test_rank_rounds_up_to_a_value_vllm_accepts(rank: int) -> None:
    got = engine_max_lora_rank(rank)
    assert got >= rank and got in get_args(MaxLoRARanks)
    assert all(r < rank for r in get_args(MaxLoRARanks) if r < got)  # the smallest such
    assert LoRAConfig(max_lora_rank=got).max_lora_rank == got  # vLLM itself takes it


def test_rank_above_vllms_largest_is_refused_with_the_limit() -> None:
    with pytest.raises(ValueError, match="above vLLM's largest max_lora_rank \\(512\\)"):
        engine_max_lora_rank(513)
