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
from typing import Sequence

import numpy as np
import torch

Rows = slice | torch.Tensor


@dataclasses.dataclass(frozen=True)
class AdapterGroups:
    """Rows of a batch grouped by adapter slot, computed once per step.

    ``groups`` holds ``(slot, rows)`` for every slot that has at least one row; ``rows`` is a
    ``slice`` when the slot's rows are contiguous (the common case: one request's tokens are
    adjacent), so the GEMM reads a view instead of copying activations.
    """

    groups: tuple[tuple[int, Rows], ...]
    num_rows: int

    @classmethod
    def from_slots(cls, slots: np.ndarray | Sequence[int]) -> "AdapterGroups":
        """Group rows by slot index; ``-1`` means "no adapter" and is dropped."""
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0 or slots.max(initial=-1) < 0:
            return cls((), int(slots.size))
        order = np.argsort(slots, kind="stable")
        sorted_slots = slots[order]
        starts = np.flatnonzero(np.r_[True, sorted_slots[1:] != sorted_slots[:-1]])
        ends = np.r_[starts[1:], sorted_slots.size]
        groups: list[tuple[int, Rows]] = []
        for start, end in zip(starts.tolist(), ends.tolist()):
            slot = int(sorted_slots[start])
            if slot < 0:
                continue
            rows = order[start:end]
            if rows[-1] - rows[0] + 1 == rows.size:
                groups.append((slot, slice(int(rows[0]), int(rows[-1]) + 1)))
            else:
                groups.append((slot, torch.from_numpy(rows.copy())))
        return cls(tuple(groups), int(slots.size))

    @property
    def empty(self) -> bool:
        """True when no row has an adapter: callers skip all adapter work."""
        return not self.groups


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
    for slot, rows in groups.groups:
        xs = x[rows]
        offset = 0
        for a, b, size in zip(a_stacked, b_stacked, output_slices):
            wa, wb = a[slot, 0], b[slot, 0]
            n = min(size, wb.shape[0])
            delta = ((xs.to(wa.dtype) @ wa.T) * scale) @ wb[:n].T
            _add_rows(y[:, offset : offset + n], rows, delta)
            offset += size
