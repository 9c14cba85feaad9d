"""Grouped LoRA shrink/expand for CPU: one matmul per adapter, no per-token gather.

vLLM's CPU ops (``vllm/lora/ops/torch_ops``) gather a full copy of the adapter weights for
every token (``weights[indices]``) and then ``einsum``; that gather dominates CPU LoRA cost,
and index ``-1`` ("no adapter") silently selects the *last* slot's weights. Here tokens are
grouped by adapter slot once per step (:class:`AdapterGroups`), each group does two small
GEMMs against its slot's weights, and rows with slot ``-1`` are never touched.

Semantics (``a(i)`` = slot of row ``i``; rows with ``a(i) = -1`` are left unchanged)::

    shrink: y[s][i]                     = scale * x[i] @ A[s][a(i)].T
    expand: y[i, off_s : off_s + n_s]  += x[s][i] @ B[s][a(i)].T
    linear: y[i, off_s : off_s + n_s]  += scale * (x[i] @ A[s][a(i)].T) @ B[s][a(i)].T

``A[s]`` has shape ``(slots, 1, rank, in)`` and ``B[s]`` ``(slots, 1, out_s, rank)``, the
layout of vLLM's ``lora_a_stacked`` / ``lora_b_stacked``; ``s`` indexes output slices
(fused qkv / gate_up projections have several).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence

import numpy as np
import torch

Rows = slice | torch.Tensor


@dataclasses.dataclass(frozen=True)
class BatchedLayout:
    """Small groups as one padded ``(G, L)`` batch, so a layer does a few ``bmm`` calls
    instead of two GEMMs per group (the per-call overhead of many tiny GEMMs dominates on
    CPU). Groups are ordered by first row; ``block`` is set when they are equal-length,
    back-to-back row ranges, so ``x[block]`` is a zero-copy ``(G, L, in)`` view."""

    slots: torch.Tensor  # (G,) slot per group
    length: int  # L: rows per group after padding
    block: tuple[int, int] | None  # (first row, G * L) for the zero-copy case
    gather: torch.Tensor | None  # (G, L) row index per padded position (padding -> row 0)
    valid: torch.Tensor | None  # (G * L,) bool: position holds a real row
    valid_rows: torch.Tensor | None  # (m,) the real rows, in padded-position order


@dataclasses.dataclass(frozen=True)
class AdapterGroups:
    """Rows of a batch grouped by adapter slot, computed once per step.

    ``groups`` holds ``(slot, rows)`` for every slot that has at least one row; ``rows`` is a
    ``slice`` when the slot's rows are contiguous (the common case: one request's tokens are
    adjacent), so the GEMM reads a view instead of copying activations. A slot may appear
    more than once, once per long run of rows (see :data:`MIN_RUN_ROWS`). ``batched`` is the
    padded layout for :func:`grouped_lora_linear`, or None when padding would more than
    double the work (very unequal groups), in which case groups run one by one.
    """

    groups: tuple[tuple[int, Rows], ...]
    num_rows: int
    batched: BatchedLayout | None = None

    @classmethod
    def from_slots(cls, slots: np.ndarray | Sequence[int]) -> AdapterGroups:
        """Group rows by slot index; ``-1`` means "no adapter" and is dropped."""
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0 or slots.max(initial=-1) < 0:
            return cls((), int(slots.size))
        order = np.argsort(slots, kind="stable")
        sorted_slots = slots[order]
        starts = np.flatnonzero(np.r_[True, sorted_slots[1:] != sorted_slots[:-1]])
        ends = np.r_[starts[1:], sorted_slots.size]
        groups: list[tuple[int, Rows]] = []
        row_lists: list[np.ndarray] = []
        for start, end in zip(starts.tolist(), ends.tolist()):
            slot = int(sorted_slots[start])
            if slot < 0:
                continue
            rows = order[start:end]
            runs = np.split(rows, np.flatnonzero(np.diff(rows) != 1) + 1)
            if len(runs) == 1 or min(r.size for r in runs) >= MIN_RUN_ROWS:
                # Contiguous rows, or a few long runs (several requests of one adapter in
                # a prefill step): views, one entry per run, accumulated in place.
                for run in runs:
                    groups.append((slot, slice(int(run[0]), int(run[-1]) + 1)))
                    row_lists.append(run)
            else:
                groups.append((slot, torch.from_numpy(rows.copy())))
                row_lists.append(rows)
        return cls(tuple(groups), int(slots.size), _batched_layout(groups, row_lists))

    @property
    def empty(self) -> bool:
        """True when no row has an adapter: callers skip all adapter work."""
        return not self.groups

    @property
    def slots(self) -> tuple[int, ...]:
        return tuple(slot for slot, _ in self.groups)

    def without(self, slots: Collection[int]) -> AdapterGroups:
        """The same rows, those of ``slots`` treated as having no adapter."""
        arr = np.full(self.num_rows, -1, dtype=np.int64)
        for slot, rows in self.groups:
            if slot not in slots:
                arr[rows if isinstance(rows, slice) else rows.numpy()] = slot
        return AdapterGroups.from_slots(arr)


def _versions(tensors: Sequence[torch.Tensor]) -> tuple[int, ...] | None:
    """In-place write counters; None for inference tensors, which have none (then nothing
    is cached)."""
    try:
        return tuple(t._version for t in tensors)
    except RuntimeError:
        return None


class NonzeroSlots:
    """Skips adapter slots whose weights in a layer are all zero.

    vLLM wraps every linear layer of the model (and the embedding) for LoRA whatever the
    adapters target, and zero-fills a slot in each layer its adapter does not touch (an
    adapter on q,k,v,o leaves gate_up, down and the embedding at zero). Such a group adds
    exactly nothing, so :meth:`restrict` drops it before any GEMM. Whether a slot is zero
    is read once per layer and slot, and read again after any in-place write to the
    layer's weights (the tensors' version counter moves: vLLM's ``set_lora`` /
    ``reset_lora``). Call :meth:`new_step` when the groups change.
    """

    def __init__(self) -> None:
        # per layer (data_ptr of its first B tensor): (versions, {slot: nonzero})
        self._layers: dict[int, tuple[tuple[int, ...] | None, dict[int, bool]]] = {}
        self._restricted: dict[tuple[int, frozenset[int]], AdapterGroups] = {}
        self._known: dict[int, Callable[[], Collection[int] | None]] = {}

    def new_step(self) -> None:
        self._restricted.clear()

    def register(
        self, b_stacked: Sequence[torch.Tensor], zero_slots: Callable[[], Collection[int] | None]
    ) -> None:
        """A layer whose zero slots its writer already knows (``zero_slots()``; None when
        it does not): those are used instead of reading the weights after each write."""
        self._known[b_stacked[0].data_ptr()] = zero_slots

    def restrict(self, groups: AdapterGroups, b_stacked: Sequence[torch.Tensor]) -> AdapterGroups:
        """``groups`` without the slots whose ``B`` weights are zero in every slice."""
        if groups.empty:
            return groups
        key = b_stacked[0].data_ptr()
        oracle = self._known.get(key)
        zero = oracle() if oracle is not None else None
        if zero is not None:
            return self._drop(groups, [slot for slot in groups.slots if slot in zero])
        versions = _versions(b_stacked)
        known = self._layers.get(key)
        if known is None or known[0] != versions or versions is None:
            known = (versions, {})
            if versions is not None:
                self._layers[key] = known
        nonzero = known[1]
        dead = []
        for slot in groups.slots:
            live = nonzero.get(slot)
            if live is None:
                live = nonzero[slot] = any(bool(b[slot].any()) for b in b_stacked)
            if not live:
                dead.append(slot)
        return self._drop(groups, dead)

    def _drop(self, groups: AdapterGroups, dead: list[int]) -> AdapterGroups:
        if not dead:
            return groups
        if len(dead) == len(groups.groups):
            return AdapterGroups((), groups.num_rows)
        cache_key = (id(groups), frozenset(dead))
        restricted = self._restricted.get(cache_key)
        if restricted is None:
            restricted = self._restricted[cache_key] = groups.without(cache_key[1])
        return restricted


MIN_RUN_ROWS = 16
"""A slot whose rows form separate runs all at least this long gets one group per run (a
view each) rather than one gathered group (a copy in, an ``index_add_`` out)."""

BATCH_MAX_ROWS = 32
"""Groups up to this many rows (decode-like steps) are batched into ``bmm`` calls; larger
groups (prefill chunks) are compute-bound and faster as one GEMM pair per group (measured
on 2 AVX2 cores: 8 x 128 rows 1.7 ms looped vs 2.4 ms batched; 8 x 32 rows 1.55 ms looped
vs 0.96 ms batched)."""


def _batched_layout(groups: list[tuple[int, Rows]], rows: list[np.ndarray]) -> BatchedLayout | None:
    if not groups:
        return None
    sizes = [r.size for r in rows]
    length, total = max(sizes), sum(sizes)
    if length > BATCH_MAX_ROWS or len(groups) * length > 2 * total:
        return None
    by_first_row = sorted(range(len(rows)), key=lambda i: int(rows[i][0]))
    groups = [groups[i] for i in by_first_row]
    rows = [rows[i] for i in by_first_row]
    sizes = [r.size for r in rows]
    slot_ids = torch.tensor([slot for slot, _ in groups], dtype=torch.long)
    first = int(rows[0][0])
    expected = first + length * np.arange(len(rows))
    if (
        all(isinstance(g, slice) for _, g in groups)
        and set(sizes) == {length}
        and all(int(r[0]) == e for r, e in zip(rows, expected.tolist()))
    ):
        return BatchedLayout(slot_ids, length, (first, len(rows) * length), None, None, None)
    gather = np.zeros((len(rows), length), dtype=np.int64)
    valid = np.zeros((len(rows), length), dtype=bool)
    for i, r in enumerate(rows):
        gather[i, : r.size] = r
        valid[i, : r.size] = True
    flat_valid = valid.reshape(-1)
    return BatchedLayout(
        slot_ids,
        length,
        None,
        torch.from_numpy(gather),
        torch.from_numpy(flat_valid),
        torch.from_numpy(gather.reshape(-1)[flat_valid].copy()),
    )


def _add_rows(y: torch.Tensor, rows: Rows, value: torch.Tensor) -> None:
    """``y[rows] += value`` for a slice (in-place view) or an index tensor."""
    if isinstance(rows, slice):
        y[rows] += value.to(y.dtype)
    else:
        y.index_add_(0, rows, value.to(y.dtype))


def _set_rows(y: torch.Tensor, rows: Rows, value: torch.Tensor) -> None:
    if isinstance(rows, slice):
        y[rows] = value.to(y.dtype)
    else:
        y.index_copy_(0, rows, value.to(y.dtype))


def grouped_lora_shrink(
    y: Sequence[torch.Tensor],  # per slice: (num_rows, rank)
    x: torch.Tensor,  # (num_rows, in)
    a_stacked: Sequence[torch.Tensor],  # per slice: (slots, 1, rank, in)
    groups: AdapterGroups,
    scale: float,
) -> None:
    """``y[s][i] = scale * x[i] @ A[s][a(i)].T`` for rows with an adapter."""
    assert x.dim() == 2 and x.shape[0] == groups.num_rows, (x.shape, groups.num_rows)
    assert len(y) == len(a_stacked)
    for slot, rows in groups.groups:
        xs = x[rows]
        for out, a in zip(y, a_stacked):
            w = a[slot, 0]
            _set_rows(out, rows, (xs.to(w.dtype) @ w.T) * scale)


def grouped_lora_expand(
    y: torch.Tensor,  # (num_rows, >= offset_start + sum(output_slices))
    x: Sequence[torch.Tensor],  # per slice: (num_rows, rank)
    b_stacked: Sequence[torch.Tensor],  # per slice: (slots, 1, out_s, rank)
    groups: AdapterGroups,
    output_slices: Sequence[int],
    offset_start: int = 0,
    add_inputs: bool = True,
) -> None:
    """``y[i, off_s:off_s+n_s] (+)= x[s][i] @ B[s][a(i)].T`` for rows with an adapter."""
    assert y.dim() == 2 and y.shape[0] == groups.num_rows, (y.shape, groups.num_rows)
    assert len(x) == len(b_stacked) == len(output_slices)
    for slot, rows in groups.groups:
        offset = offset_start
        for xs, b, size in zip(x, b_stacked, output_slices):
            w = b[slot, 0]
            n = min(size, w.shape[0])  # adapters may be padded differently from the model
            delta = xs[rows].to(w.dtype) @ w[:n].T
            target = y[:, offset : offset + n]
            (_add_rows if add_inputs else _set_rows)(target, rows, delta)
            offset += size


def grouped_lora_linear(
    y: torch.Tensor,  # (num_rows, >= sum(output_slices))
    x: torch.Tensor,  # (num_rows, in)
    a_stacked: Sequence[torch.Tensor],  # per slice: (slots, 1, rank, in)
    b_stacked: Sequence[torch.Tensor],  # per slice: (slots, 1, out_s, rank)
    groups: AdapterGroups,
    scale: float,
    output_slices: Sequence[int],
) -> None:
    """Fused shrink+expand: ``y[i, slice s] += scale * x[i] @ A.T @ B.T`` per group."""
    assert x.dim() == 2 and y.dim() == 2 and x.shape[0] == y.shape[0] == groups.num_rows
    assert len(a_stacked) == len(b_stacked) == len(output_slices)
    if groups.batched is not None:
        _batched_lora_linear(y, x, a_stacked, b_stacked, groups.batched, scale, output_slices)
        return
    if groups.empty:
        return
    # Views made once per call, so a group costs one op per operand, not several.
    fused = fused_lora_a(a_stacked)
    a_t = None if fused is None else fused.transpose(1, 2)  # (slots, in, S*r)
    targets = []  # per slice: output columns, B^T of every slot (slots, r, n), rank columns
    offset, r0 = 0, 0
    for b, size in zip(b_stacked, output_slices):
        n = min(size, b.shape[2])  # adapters may be padded differently from the model
        rank = b.shape[3]
        targets.append(
            (y[:, offset : offset + n], b[:, 0, :n].transpose(1, 2), slice(r0, r0 + rank))
        )
        offset += size
        r0 += rank
    for slot, rows in groups.groups:
        # One GEMM shrinks all slices (fused qkv / gate_up), then one per slice expands.
        w = a_t[slot] if a_t is not None else torch.cat([a[slot, 0] for a in a_stacked]).T
        t = x[rows].to(w.dtype) @ w
        if scale != 1.0:
            t = t * scale
        for target, b_t, ranks in targets:
            _add_product_t(target, rows, t[:, ranks], b_t[slot])


def fused_lora_a(a_stacked: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """``(slots, S*r, in)``: every slice's ``A`` of a slot as one matrix, so one GEMM shrinks
    all slices (fused qkv / gate_up) with no per-call ``cat``: a view, when the slices are
    row blocks of one buffer (:func:`fuse_lora_a_buffers`; how the CPU worker lays them
    out), else None."""
    if len(a_stacked) == 1:
        return a_stacked[0][:, 0]
    first = a_stacked[0]
    slots, _, rank, in_f = first.shape
    step = rank * in_f * first.element_size()
    if (
        all(
            a.shape == first.shape
            and a.dtype == first.dtype
            and a.stride() == first.stride()
            and a.stride()[2:] == (in_f, 1)
            and a.data_ptr() == first.data_ptr() + i * step
            and a.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
            for i, a in enumerate(a_stacked)
        )
        and first.stride(0) == len(a_stacked) * rank * in_f
    ):
        return first.as_strided((slots, len(a_stacked) * rank, in_f), (first.stride(0), in_f, 1))
    return None


def fuse_lora_a_buffers(a_stacked: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The same ``A`` slices as views of one ``(slots, 1, S*r, in)`` buffer (contents
    copied), for which :func:`fused_lora_a` is a view instead of a per-call ``cat``."""
    first = a_stacked[0]
    rank = first.shape[2]
    if len(a_stacked) == 1 or any(
        a.shape != first.shape or a.dtype != first.dtype for a in a_stacked
    ):
        return tuple(a_stacked)
    fused = torch.cat(list(a_stacked), dim=2).contiguous()
    return tuple(fused[:, :, i * rank : (i + 1) * rank] for i in range(len(a_stacked)))


def _add_product_t(y: torch.Tensor, rows: Rows, t: torch.Tensor, w_t: torch.Tensor) -> None:
    """``y[rows] += t @ w_t``; for a slice, one ``addmm_`` that accumulates straight into
    ``y`` (a column slice of a row-major matrix is a valid GEMM output), no temporary."""
    if isinstance(rows, slice) and y.dtype == t.dtype == w_t.dtype:
        y[rows].addmm_(t, w_t)
    else:
        _add_rows(y, rows, t @ w_t)


def _batched_lora_linear(
    y: torch.Tensor,
    x: torch.Tensor,
    a_stacked: Sequence[torch.Tensor],
    b_stacked: Sequence[torch.Tensor],
    layout: BatchedLayout,
    scale: float,
    output_slices: Sequence[int],
) -> None:
    """One ``bmm`` shrinks every slice of every group; one ``bmm`` per slice expands."""
    g, length = layout.slots.numel(), layout.length
    if layout.block is not None:
        start, count = layout.block
        xg = x[start : start + count].view(g, length, x.shape[-1])
    else:
        xg = x[layout.gather]  # (G, L, in)
    fused = fused_lora_a(a_stacked)
    a_all = (
        fused[layout.slots]
        if fused is not None  # (G, S*r, in)
        else torch.cat([a[layout.slots, 0] for a in a_stacked], dim=1)
    )
    t = torch.bmm(xg.to(a_all.dtype), a_all.transpose(1, 2))  # (G, L, S*r)
    if scale != 1.0:
        t = t * scale
    offset, r0 = 0, 0
    for b, size in zip(b_stacked, output_slices):
        w = b[layout.slots, 0]  # (G, out_s, r)
        rank, n = w.shape[2], min(size, w.shape[1])
        target = y[:, offset : offset + n]
        if layout.block is not None and y.dtype == t.dtype:
            # Accumulate into the (G, L, n) strided view of y: no temporary.
            torch.unflatten(target[start : start + count], 0, (g, length)).baddbmm_(
                t[:, :, r0 : r0 + rank], w[:, :n].transpose(1, 2)
            )
            offset += size
            r0 += rank
            continue
        delta = torch.bmm(t[:, :, r0 : r0 + rank], w[:, :n].transpose(1, 2))  # (G, L, n)
        if layout.block is not None:
            target[start : start + count] += delta.reshape(count, n).to(y.dtype)
        else:
            rows = delta.reshape(g * length, n)[layout.valid]
            assert layout.valid_rows is not None  # gathered layouts always have them
            target.index_add_(0, layout.valid_rows, rows.to(y.dtype))
        offset += size
        r0 += rank
