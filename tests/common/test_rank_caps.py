"""The shared rank caps are ones the workers can actually serve."""

from __future__ import annotations

import typing

import pytest

from preft_serve.common.rank_caps import RANK_CAPS, REFT_KERNEL_MAX_RANK
from preft_serve.registry.validation import UploadBounds


def test_registry_validation_defaults_are_the_rank_caps() -> None:
    limits = UploadBounds()
    assert (limits.max_lora_rank, limits.max_reft_rank) == (
        RANK_CAPS.max_lora_rank,
        RANK_CAPS.max_reft_rank,
    )


def test_reft_rank_fits_the_gpu_kernel() -> None:
    reft_triton = pytest.importorskip("preft_kernels.reft_triton")
    assert REFT_KERNEL_MAX_RANK == reft_triton.MAX_RANK
    assert 1 <= RANK_CAPS.max_reft_rank <= REFT_KERNEL_MAX_RANK


def test_lora_rank_is_one_vllm_accepts() -> None:
    lora = pytest.importorskip("vllm.config.lora")
    assert RANK_CAPS.max_lora_rank in typing.get_args(lora.MaxLoRARanks)
