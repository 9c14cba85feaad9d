"""Grouped CPU LoRA kernels against a float64 reference, and vLLM's stock ops' -1 bug."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from preft_kernels import (
    AdapterGroups,
    NonzeroSlots,
    fuse_lora_a_buffers,
    fused_lora_a,
    grouped_lora_expand,
    grouped_lora_linear,
    grouped_lora_shrink,
)
from preft_kernels.reference import lora_linear_reference

# (in_features, output slices): Llama q_proj, fused qkv (GQA), fused gate_up, o_proj-like.
SHAPES = [(64, (64,)), (128, (128, 32, 32)), (96, (256, 256)), (896, (896, 128, 128))]


def stacked(
    slots: int,
    rank: int,
    in_f: int,
    outs: tuple[int, ...],
    used_rank: int | None,
    gen: torch.Generator,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """vLLM-layout weights; ranks above ``used_rank`` are zero padding, as vLLM pads."""
    a = [torch.randn(slots, 1, rank, in_f, generator=gen, dtype=torch.float32) for _ in outs]
    b = [torch.randn(slots, 1, o, rank, generator=gen, dtype=torch.float32) for o in outs]
    if used_rank is not None:
        for t in a:
            t[:, :, used_rank:] = 0
        for t in b:
            t[..., used_rank:] = 0
    return a, b


def random_slots(rng: np.random.Generator, rows: int, slots: int, kind: str) -> np.ndarray:
    if kind == "none":
        return np.full(rows, -1)
    if kind == "segments":  # one request after another, as vLLM lays tokens out
        lengths = rng.integers(1, 6, size=rows)
        ids = rng.integers(-1, slots, size=rows)
        return np.repeat(ids, lengths)[:rows]
    return rng.integers(-1, slots, size=rows)  # "interleaved": worst case, many 1-row groups


@pytest.mark.parametrize("in_f,outs", SHAPES)
@pytest.mark.parametrize("kind", ["segments", "interleaved", "none"])
@pytest.mark.parametrize("rows,slots", [(0, 4), (1, 1), (7, 3), (64, 16), (33, 64)])
def test_linear_matches_float64_reference(in_f, outs, kind, rows, slots) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + slots)
    rng = np.random.default_rng(rows + slots)
    a, b = stacked(slots, 16, in_f, outs, used_rank=8, gen=gen)
    row_slots = random_slots(rng, rows, slots, kind)
    x = torch.randn(rows, in_f, generator=gen)
    y = torch.randn(rows, sum(outs), generator=gen)
    want = lora_linear_reference(y, x, a, b, row_slots.tolist(), 0.5, outs)
    grouped_lora_linear(y, x, a, b, AdapterGroups.from_slots(row_slots), 0.5, outs)
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("in_f,outs", SHAPES)
def test_shrink_then_expand_equals_linear(in_f, outs) -> None:
    gen = torch.Generator().manual_seed(7)
    rows, slots = 40, 5
    a, b = stacked(slots, 8, in_f, outs, used_rank=None, gen=gen)
    row_slots = np.random.default_rng(3).integers(-1, slots, size=rows)
    groups = AdapterGroups.from_slots(row_slots)
    x = torch.randn(rows, in_f, generator=gen)
    y = torch.randn(rows, sum(outs) + 8, generator=gen)  # wider than the slices: offset 8
    want = y.double().clone()
    want[:, 8:] = lora_linear_reference(y[:, 8:], x, a, b, row_slots.tolist(), 2.0, outs)
    buffers = torch.zeros(len(outs), rows, 8)
    grouped_lora_shrink(buffers, x, a, groups, 2.0)
    grouped_lora_expand(y, buffers, b, groups, outs, offset_start=8)
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-3)


def test_groups_use_views_for_contiguous_rows_and_drop_no_adapter_rows() -> None:
    groups = AdapterGroups.from_slots([2, 2, 2, -1, 0, 0, -1, 2])
    as_dict = dict(groups.groups)
    assert set(as_dict) == {0, 2}
    assert as_dict[0] == slice(4, 6)
    assert as_dict[2].tolist() == [0, 1, 2, 7]
    assert AdapterGroups.from_slots([-1, -1]).empty and AdapterGroups.from_slots([]).empty


def test_rows_without_adapter_are_untouched_even_with_nan_weights() -> None:
    a = [torch.full((2, 1, 4, 8), float("nan"))]
    b = [torch.full((2, 1, 8, 4), float("nan"))]
    y = torch.ones(3, 8)
    no_adapter = AdapterGroups.from_slots([-1, -1, -1])
    grouped_lora_linear(y, torch.ones(3, 8), a, b, no_adapter, 1.0, (8,))
    assert torch.equal(y, torch.ones(3, 8))


def test_stock_vllm_cpu_ops_apply_last_slot_to_no_adapter_tokens() -> None:
    """vLLM 0.32's torch ops index weights with -1, i.e. the *last* slot (documented bug)."""
    from vllm.lora.ops.torch_ops import bgmv_expand, bgmv_shrink

    gen = torch.Generator().manual_seed(0)
    a, b = stacked(2, 4, 16, (16,), used_rank=None, gen=gen)
    x = torch.randn(3, 16, generator=gen)
    slots = [0, -1, -1]
    want = lora_linear_reference(torch.zeros(3, 16), x, a, b, slots, 1.0, (16,))
    assert torch.count_nonzero(want[1:]) == 0  # reference: no adapter, no change

    buffer = torch.zeros(3, 4)
    stock = torch.zeros(3, 16)
    idx = torch.tensor(slots)
    bgmv_shrink(x, a[0], buffer, idx, 1.0)
    bgmv_expand(buffer, b[0], stock, idx, add_inputs=True)
    last_slot = lora_linear_reference(torch.zeros(3, 16), x, a, b, [0, 1, 1], 1.0, (16,))
    torch.testing.assert_close(stock.double(), last_slot, rtol=1e-4, atol=1e-4)  # the bug

    ours = torch.zeros(3, 16)
    grouped_lora_linear(ours, x, a, b, AdapterGroups.from_slots(slots), 1.0, (16,))
    torch.testing.assert_close(ours.double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["block", "gather", "unbalanced", "large"])
def test_batched_layouts_match_reference(layout: str) -> None:
    """Prefill-like equal groups use a zero-copy (G, L, in) view; others a padded gather;
    very unequal groups fall back to one group at a time."""
    gen = torch.Generator().manual_seed(11)
    if layout == "block":  # 4 requests x 16 tokens, after 5 rows of base-model decode tokens
        slots = np.r_[np.full(5, -1), np.repeat([3, 0, 2, 1], 16)]
    elif layout == "large":  # prefill-sized groups: one GEMM pair per group is faster
        slots = np.repeat([1, 0], 100)
    elif layout == "gather":
        slots = np.r_[np.repeat([2, 0], 9), [-1, 1, 1, -1, 1], np.repeat([3], 7)]
    else:
        slots = np.r_[np.repeat([0], 40), [1, 2]]
    groups = AdapterGroups.from_slots(slots)
    if layout in ("unbalanced", "large"):
        assert groups.batched is None
    else:
        assert groups.batched is not None
        assert (groups.batched.block is not None) == (layout == "block")
    outs = (128, 32, 32)
    a, b = stacked(4, 8, 64, outs, used_rank=6, gen=gen)
    x = torch.randn(len(slots), 64, generator=gen)
    y = torch.randn(len(slots), sum(outs), generator=gen)
    want = lora_linear_reference(y, x, a, b, slots.tolist(), 0.5, outs)
    grouped_lora_linear(y, x, a, b, groups, 0.5, outs)
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-3)


def test_without_treats_dropped_slots_as_no_adapter() -> None:
    slots = np.array([2, 2, 0, -1, 1, 1, 0, 2])
    dropped = AdapterGroups.from_slots(slots).without({0, 2})
    assert dropped == AdapterGroups.from_slots(np.where(np.isin(slots, [0, 2]), -1, slots))
    assert dropped.slots == (1,)


def test_nonzero_slots_skip_zero_layers_and_notice_rewrites() -> None:
    """A slot whose B is zero in a layer (its adapter does not target the layer) is skipped;
    writing weights into the slot in place (vLLM's set_lora) makes it count again."""
    gen = torch.Generator().manual_seed(5)
    outs = (32, 16)
    a, b = stacked(3, 4, 24, outs, used_rank=None, gen=gen)
    for t in b:
        t[0].zero_()  # slot 0: an adapter without this layer
    slots = np.repeat([0, 1, -1, 2], 5)
    groups = AdapterGroups.from_slots(slots)
    nonzero = NonzeroSlots()
    assert nonzero.restrict(groups, b).slots == (1, 2)
    x = torch.randn(len(slots), 24, generator=gen)
    y = torch.randn(len(slots), sum(outs), generator=gen)
    want = lora_linear_reference(y, x, a, b, slots.tolist(), 1.0, outs)
    grouped_lora_linear(y, x, a, b, nonzero.restrict(groups, b), 1.0, outs)
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-3)

    with torch.inference_mode():  # as in vLLM's model runner
        b[1][0, 0].copy_(torch.randn(16, 4, generator=gen))
    assert nonzero.restrict(groups, b).slots == (0, 1, 2)
    for t in b:
        t[1:].zero_()
    assert nonzero.restrict(groups, b).slots == (0,)
    for t in b:
        t.zero_()
    assert nonzero.restrict(groups, b).empty


def test_nonzero_slots_without_version_counters_check_every_call() -> None:
    with torch.inference_mode():  # inference tensors have no version counter
        b = [torch.zeros(2, 1, 8, 4)]
        groups = AdapterGroups.from_slots([0, 0, 1])
        nonzero = NonzeroSlots()
        assert nonzero.restrict(groups, b).empty
        b[0][1, 0, 0, 0] = 1.0
        assert nonzero.restrict(groups, b).slots == (1,)


@pytest.mark.parametrize("run", [20, 100])
def test_long_runs_of_one_slot_become_views_and_match_reference(run: int) -> None:
    """Two requests of one adapter in a prefill step: a view per run, no gather."""
    slots = np.r_[np.full(run, 1), np.full(3, -1), np.full(run, 0), np.full(run, 1)]
    groups = AdapterGroups.from_slots(slots)
    assert all(isinstance(rows, slice) for _, rows in groups.groups)
    assert sorted(groups.slots) == [0, 1, 1]
    gen = torch.Generator().manual_seed(run)
    outs = (64, 16, 16)
    a, b = stacked(2, 8, 32, outs, used_rank=None, gen=gen)
    x = torch.randn(len(slots), 32, generator=gen)
    y = torch.randn(len(slots), sum(outs), generator=gen)
    want = lora_linear_reference(y, x, a, b, slots.tolist(), 0.5, outs)
    grouped_lora_linear(y, x, a, b, groups, 0.5, outs)
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-3)
    short = AdapterGroups.from_slots(np.r_[np.full(run, 1), [0], np.full(5, 1)])
    assert not isinstance(dict(short.groups)[1], slice)  # short runs: one gathered group


@pytest.mark.parametrize("in_f,outs", SHAPES)
@pytest.mark.parametrize("kind", ["segments", "interleaved"])
@pytest.mark.parametrize("rows", [7, 64, 300])
def test_fused_a_buffers_are_views_and_match_reference(in_f, outs, kind, rows) -> None:
    """q,k,v (gate,up) A slices laid out as row blocks of one buffer: one shrink GEMM per
    adapter reads them in place (no per-call cat), with the reference's results; writes
    through the per-slice views (vLLM's set_lora) land in the fused matrix."""
    gen = torch.Generator().manual_seed(rows + len(outs))
    a, b = stacked(4, 8, in_f, outs, used_rank=6, gen=gen)
    fused_a = fuse_lora_a_buffers(a)
    assert all(torch.equal(f, s) for f, s in zip(fused_a, a))
    fused = fused_lora_a(fused_a)
    assert fused is not None and fused.shape == (4, 8 * len(outs), in_f)
    assert fused.untyped_storage().data_ptr() == fused_a[0].untyped_storage().data_ptr()
    if len(outs) > 1:
        assert fused_lora_a(a) is None  # separate buffers: the kernel concatenates per group
    fused_a[-1][2, 0].fill_(0.25)
    assert torch.equal(fused[2, -8:], torch.full((8, in_f), 0.25))
    a[-1][2, 0].fill_(0.25)

    row_slots = random_slots(np.random.default_rng(rows), rows, 4, kind)
    x = torch.randn(rows, in_f, generator=gen)
    y = torch.randn(rows, sum(outs), generator=gen)
    want = lora_linear_reference(y, x, a, b, row_slots.tolist(), 0.5, outs)
    y_split = y.clone()
    grouped_lora_linear(y, x, fused_a, b, AdapterGroups.from_slots(row_slots), 0.5, outs)
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-3)
    grouped_lora_linear(y_split, x, a, b, AdapterGroups.from_slots(row_slots), 0.5, outs)
    torch.testing.assert_close(y_split, y, rtol=1e-5, atol=1e-5)


def test_nonzero_slots_use_a_registered_writer_knowledge_instead_of_reading() -> None:
    """A layer whose writer knows its zero slots (the worker's slot tracking) is not read
    after each write; when the writer cannot know (None) the weights are read as before."""
    gen = torch.Generator().manual_seed(9)
    a, b = stacked(3, 4, 16, (16,), used_rank=None, gen=gen)
    groups = AdapterGroups.from_slots(np.repeat([0, 1, 2], 4))
    nonzero = NonzeroSlots()
    answer: list[set[int] | None] = [{1}]
    nonzero.register(b, lambda: answer[0])
    b[0][1].zero_()  # agrees with the writer
    restricted = nonzero.restrict(groups, b)
    assert restricted.slots == (0, 2)
    x, y = torch.randn(12, 16, generator=gen), torch.randn(12, 16, generator=gen)
    want = lora_linear_reference(y, x, a, b, np.repeat([0, 1, 2], 4).tolist(), 1.0, (16,))
    grouped_lora_linear(y, x, a, b, restricted, 1.0, (16,))
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-3)
    answer[0] = {0, 1, 2}
    assert nonzero.restrict(groups, b).empty
    answer[0] = None  # unknown: read the weights (slot 1 is zero)
    assert nonzero.restrict(groups, b).slots == (0, 2)
