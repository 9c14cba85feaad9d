"""Adapter slot writes and per-step routing (``vllm_compat.lora_layers.SlotState`` /
``SlotRouter``, over ``slots.ZeroSlots``).

vLLM's layers are built here without a model (their ``__init__`` needs a distributed
setup): the attributes their ``set_lora`` / ``reset_lora`` / ``forward`` read are set by
hand, and every write is checked against an unwrapped twin doing vLLM's stock writes.
"""

from __future__ import annotations

import pytest
import torch
from vllm.lora.layers import (
    MergedColumnParallelLinearWithLoRA,
    RowParallelLinearWithLoRA,
    VocabParallelEmbeddingWithLoRA,
)

from preft_kernels.reference import lora_linear_reference
from preft_serve.worker.vllm_compat.lora_layers import SlotRouter, SlotState, slot_buffers
from preft_serve.worker.vllm_compat.punica_cpu import GroupedPunicaWrapperCPU

SLOTS, RANK, IN = 4, 8, 16


class FakeBase(torch.nn.Module):
    """What vLLM's LoRA linear layers read of their single-device base layer."""

    bias = None
    skip_bias_add = gather_output = return_bias = reduce_results = False
    input_is_parallel = True

    def __init__(self, out: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out, IN), requires_grad=False)
        self.quant_method = self

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: object = None) -> torch.Tensor:
        return x @ layer.weight.T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply(self, x)


def linear(cls: type, outs: tuple[int, ...]) -> torch.nn.Module:
    module = cls.__new__(cls)
    torch.nn.Module.__init__(module)
    module.tp_size, module.tp_rank, module.n_slices = 1, 0, len(outs)
    module.output_slices = outs
    module._enable_aux_cuda_stream = False
    module.lora_a_stacked = tuple(torch.zeros(SLOTS, 1, RANK, IN) for _ in outs)
    module.lora_b_stacked = tuple(torch.zeros(SLOTS, 1, o, RANK) for o in outs)
    module.base_layer = FakeBase(sum(outs))
    return module


def embedding() -> torch.nn.Module:
    module = VocabParallelEmbeddingWithLoRA(torch.nn.Embedding(32, IN))
    module.lora_a_stacked = torch.zeros(SLOTS, 32, RANK)
    module.lora_b_stacked = torch.zeros(SLOTS, 1, IN, RANK)
    return module


def buffers(module: torch.nn.Module) -> list[torch.Tensor]:
    return [t.clone() for t in slot_buffers(module)]


def count_stock_resets(state: SlotState) -> list[int]:
    calls: list[int] = []
    stock = state.stock_reset

    def counting(index: int) -> None:
        calls.append(index)
        stock(index)

    state.stock_reset = counting
    return calls


def test_slot_writes_equal_stock_and_skip_redundant_zeroing() -> None:
    gen = torch.Generator().manual_seed(0)
    outs = (16, 8, 8)
    ours, stock = (
        linear(MergedColumnParallelLinearWithLoRA, outs),
        linear(MergedColumnParallelLinearWithLoRA, outs),
    )
    state = SlotState(ours)
    resets = count_stock_resets(state)
    assert state.zero == {0, 1, 2, 3}

    def full() -> tuple[list, list]:
        return (
            [torch.randn(RANK, IN, generator=gen) for _ in outs],
            [torch.randn(o, RANK, generator=gen) for o in outs],
        )

    ops = [
        ("set", 0, full()),  # covers the slot: no zeroing first
        ("reset", 1, None),  # already zero: nothing written
        (
            "set",
            1,
            (
                [torch.randn(4, IN, generator=gen) for _ in outs],  # rank 4 < 8
                [torch.randn(o, 4, generator=gen) for o in outs],
            ),
        ),
        ("set", 1, full()),  # covers: the rank-4 leftovers are overwritten anyway
        (
            "set",
            2,
            (
                [torch.randn(RANK, IN, generator=gen), None, None],  # q only
                [torch.randn(16, RANK, generator=gen), None, None],
            ),
        ),
        ("reset", 0, None),  # holds weights: zeroed
        ("reset", 0, None),  # now zero: skipped
        ("set", 3, full()),
        ("set", 2, full()),
    ]
    for op, index, weights in ops:
        for module in (ours, stock):
            if op == "set":
                module.set_lora(index, *weights)
            else:
                module.reset_lora(index)
        assert all(torch.equal(a, b) for a, b in zip(buffers(ours), buffers(stock))), (op, index)
    # Stock zeroing ran for: the rank-4 copy (slot 1 zero: skipped), the q-only copy of
    # slot 2 (zero: skipped), the reset of slot 0 holding weights.
    assert resets == [0]
    assert state.zero == {0}


def test_writes_outside_the_wrapper_are_noticed() -> None:
    module = linear(RowParallelLinearWithLoRA, (IN,))
    state = SlotState(module)
    resets = count_stock_resets(state)
    module.lora_b_stacked[0][2, 0, 0, 0] = 1.0  # not through set_lora: version moves
    assert state.known_zero() == {0, 1, 3}  # read again
    module.reset_lora(2)
    module.reset_lora(3)
    assert resets == [2] and torch.count_nonzero(module.lora_b_stacked[0]) == 0
    with torch.inference_mode():  # inference tensors: no version counter, nothing known
        module.lora_a_stacked = (torch.zeros(SLOTS, 1, RANK, IN),)
        module.lora_b_stacked = (torch.zeros(SLOTS, 1, IN, RANK),)
    state = SlotState(module)
    resets = count_stock_resets(state)
    module.reset_lora(1)
    assert resets == [1] and state.known_zero() == set()


def test_embedding_slots_are_tracked_too() -> None:
    module = embedding()
    assert SlotState.tracks(module)
    state = SlotState(module)
    resets = count_stock_resets(state)
    module.reset_lora(1)
    assert resets == [] and state.known_zero() == {0, 1, 2, 3}


def wrapper_with(token_ids: list[int], index_to_id: list[int | None]) -> GroupedPunicaWrapperCPU:
    from vllm.lora.layers import LoRAMapping

    wrapper = GroupedPunicaWrapperCPU(64, max_batches=8, device="cpu")
    wrapper.update_metadata(
        LoRAMapping(tuple(token_ids), (token_ids[-1],), is_prefill=True), index_to_id, SLOTS + 1, 32
    )
    return wrapper


@pytest.mark.parametrize("bypass", [True, False])
def test_layers_whose_step_slots_are_zero_run_the_base_layer(
    monkeypatch: pytest.MonkeyPatch, bypass: bool
) -> None:
    """A step's layers without weights for its adapters (all layers in a decode step of
    prefill-only adapters; the MLP for a q,k,v,o adapter) skip vLLM's LoRA wrapper: no
    punica call at all, the base layer's output."""
    gen = torch.Generator().manual_seed(1)
    qkv = linear(MergedColumnParallelLinearWithLoRA, (16, 8, 8))
    down = linear(RowParallelLinearWithLoRA, (IN,))
    for m in (qkv, down):
        m.set_mapping(wrapper_with([0], [None] * SLOTS))
    router = SlotRouter([SlotState(qkv), SlotState(down)], bypass=bypass)
    assert SlotRouter([], bypass=True).wrappers == []
    qkv.set_lora(
        1,
        [torch.randn(RANK, IN, generator=gen) for _ in range(3)],
        [torch.randn(o, RANK, generator=gen) for o in (16, 8, 8)],
    )
    down.reset_lora(1)  # the adapter in slot 1 has no down_proj weights

    calls: list[str] = []
    real = GroupedPunicaWrapperCPU.add_lora_linear

    def counting(self, y, x, *args, **kwargs):
        calls.append("linear")
        return real(self, y, x, *args, **kwargs)

    monkeypatch.setattr(GroupedPunicaWrapperCPU, "add_lora_linear", counting)
    x = torch.randn(3, IN, generator=gen)
    for step_ids, index_to_id in (([7, 7, 0], [None, 7, None, None]), ([0, 0, 0], [None] * 4)):
        wrapper = wrapper_with(step_ids, index_to_id)
        for m in (qkv, down):
            m.set_mapping(wrapper)
        router.wrappers = [wrapper]
        router.route()
        calls.clear()
        out_qkv = qkv(x)
        out_down = down(x)
        prefill = 7 in step_ids
        assert ("forward" in down.__dict__) == bypass
        assert ("forward" in qkv.__dict__) == (bypass and not prefill)
        base_qkv, base_down = qkv.base_layer(x), down.base_layer(x)
        slots = [1 if i == 7 else -1 for i in step_ids]
        want = lora_linear_reference(
            base_qkv, x, qkv.lora_a_stacked, qkv.lora_b_stacked, slots, 1.0, (16, 8, 8)
        )
        torch.testing.assert_close(out_qkv.double(), want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out_down, base_down)
        expected_calls = 2 - (1 if bypass else 0) - (1 if bypass and not prefill else 0)
        assert len(calls) == expected_calls


def test_vllm_metadata_is_built_only_when_an_embedding_slot_is_live(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's own punica metadata feeds only the embedding LoRA layer: with every layer of
    the wrapper tracked and no embedding weights in the step's slots it is not built."""
    from vllm.lora.layers import LoRAMapping
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    built: list[int] = []
    stock = PunicaWrapperCPU.update_metadata

    def counting(self, *args, **kwargs):
        built.append(1)
        return stock(self, *args, **kwargs)

    monkeypatch.setattr(PunicaWrapperCPU, "update_metadata", counting)
    wrapper = GroupedPunicaWrapperCPU(64, max_batches=8, device="cpu")
    emb, qkv = embedding(), linear(MergedColumnParallelLinearWithLoRA, (16, 8, 8))
    for m in (emb, qkv):
        m.set_mapping(wrapper)
    router = SlotRouter([SlotState(emb), SlotState(qkv)], bypass=True)
    wrapper.needs_vllm_metadata = router.embedding_check(wrapper)
    mapping = LoRAMapping((7, 7, 0), (0,), is_prefill=True)
    wrapper.update_metadata(mapping, [None, 7, None, None], SLOTS + 1, 32)
    assert built == [] and not wrapper.no_lora
    assert torch.count_nonzero(wrapper._embeddings_indices[:3]) == 0
    emb.set_lora(1, torch.randn(RANK, 32), torch.randn(IN, RANK))  # slot 1 gets embeddings
    wrapper.update_metadata(mapping, [None, 7, None, None], SLOTS + 1, 32)
    assert built == [1]
