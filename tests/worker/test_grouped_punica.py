"""The CPU punica wrapper: grouped kernels behind vLLM's interface, idle without adapters."""

from __future__ import annotations

import pytest
import torch

from preft_kernels.reference import lora_linear_reference
from preft_serve.worker.vllm_compat import punica_cpu


def make_wrapper() -> punica_cpu.GroupedPunicaWrapperCPU:
    return punica_cpu.GroupedPunicaWrapperCPU(64, max_batches=8, device="cpu")


def mapping(token_ids: list[int], sampled_ids: list[int]):
    from vllm.lora.layers import LoRAMapping

    return LoRAMapping(tuple(token_ids), tuple(sampled_ids), is_prefill=True)


def test_step_without_adapter_tokens_launches_no_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args, **kwargs):
        raise AssertionError("adapter kernel called in a step with no adapter token")

    for name in ("grouped_lora_linear", "grouped_lora_shrink", "grouped_lora_expand"):
        monkeypatch.setattr(punica_cpu, name, forbidden)
    wrapper = make_wrapper()
    wrapper.update_metadata(mapping([0, 0, 0], [0, 0]), [11, 12], 3, 320)
    nan_a = (torch.full((2, 1, 4, 8), float("nan")),)
    nan_b = (torch.full((2, 1, 8, 4), float("nan")),)
    y = torch.ones(3, 8)
    wrapper.add_lora_linear(y, torch.ones(3, 8), nan_a, nan_b, 1.0, (8,))
    wrapper.add_shrink(torch.zeros(1, 3, 4), torch.ones(3, 8), nan_a, 1.0)
    wrapper.add_expand(y, torch.zeros(1, 3, 4), nan_b, (8,))
    wrapper.add_lora_logits(y, torch.ones(3, 8), nan_a[0], nan_b[0], 1.0)
    assert torch.equal(y, torch.ones(3, 8))
    assert wrapper.no_lora


def test_adapter_ids_map_to_slots_and_match_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    a = (torch.randn(2, 1, 4, 8, generator=gen),)
    b = (torch.randn(2, 1, 8, 4, generator=gen),)
    wrapper = make_wrapper()
    # lora_index_to_id: slot 0 holds adapter 12, slot 1 holds adapter 11.
    wrapper.update_metadata(mapping([11, 0, 12, 12], [12]), [12, 11], 3, 320)
    x, y = torch.randn(4, 8, generator=gen), torch.zeros(4, 8)
    want = lora_linear_reference(y, x, a, b, [1, -1, 0, 0], 1.0, (8,))
    wrapper.add_lora_linear(y, x, a, b, 1.0, (8,))
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)


def test_layers_an_adapter_does_not_target_launch_no_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM wraps every linear layer and the embedding; slots left at zero there (an adapter
    on q,k,v,o has no MLP or embedding weights) cost nothing."""
    calls = []
    real_linear = punica_cpu.grouped_lora_linear

    def counting(*args, **kwargs):
        calls.append(args[4].slots)
        return real_linear(*args, **kwargs)

    def forbidden(*args, **kwargs):
        raise AssertionError("embedding kernel called for all-zero embedding weights")

    monkeypatch.setattr(punica_cpu, "grouped_lora_linear", counting)
    monkeypatch.setattr(punica_cpu, "grouped_lora_expand", forbidden)
    wrapper = make_wrapper()
    wrapper.update_metadata(mapping([11, 11, 12, 12], [12]), [12, 11], 3, 320)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 8, generator=gen), torch.zeros(4, 8)
    zero_a, zero_b = (torch.randn(2, 1, 4, 8),), (torch.zeros(2, 1, 8, 4),)
    wrapper.add_lora_linear(y, x, zero_a, zero_b, 1.0, (8,))
    wrapper.add_lora_embedding(y, torch.randn(4, 4), zero_b[0])
    wrapper.add_lora_logits(y, x, zero_a[0], zero_b[0], 1.0)
    assert calls == [] and torch.count_nonzero(y) == 0

    a, b = (torch.randn(2, 1, 4, 8, generator=gen),), (torch.randn(2, 1, 8, 4, generator=gen),)
    b[0][1].zero_()  # adapter 11 (slot 1) lacks this layer, adapter 12 (slot 0) has it
    want = lora_linear_reference(y, x, a, b, [1, 1, 0, 0], 1.0, (8,))
    wrapper.add_lora_linear(y, x, a, b, 1.0, (8,))
    assert calls == [(0,)]
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)
