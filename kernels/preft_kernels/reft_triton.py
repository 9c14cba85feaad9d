"""Grouped low-rank ReFT interventions as one Triton launch per decoder layer (GPU path).

Same op as :func:`preft_kernels.reft.grouped_reft`, for rows grouped by intervention::

    for g in groups, i in rows(g), k = index(g), if k >= 0:
        delta[i] = (h[i] @ proj_in[k].T + bias[k]) @ proj_out[k]
        out[i]  += delta[i]

The torch path issues three kernels per group, so a step with hundreds of adapters is
launch-bound; here one program handles one block of one group's rows: it streams ``h`` once
over ``d`` to build the rank-``r`` projection ``t`` in registers, then streams ``out`` once
to add ``t @ proj_out[k]``. ``t`` never reaches device memory, and weights (``r × d`` per
intervention) are re-read per row block from L2. Rows are gathered through ``row_ids``, so
a group's rows need not be contiguous; rows in no group are never read or written.

A step groups its rows once for every decoder layer: :class:`ReftTritonStepMeta` holds the
rows and, per layer, the intervention each group uses there (``-1``: none at that layer,
the group is skipped), built with one host→device copy per step. :class:`ReftTritonMeta`
is the one-layer form.

Triton is imported guardedly: ``import preft_kernels`` and :class:`ReftTritonMeta` work
without it, only :func:`reft_triton` needs it. The module is not re-exported from
``preft_kernels``; import it as ``from preft_kernels.reft_triton import reft_triton``.
On CPU, set ``TRITON_INTERPRET=1`` *before* importing this module to run the interpreter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from preft_kernels.reft import ReftGroup

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # CPU-only installs: the torch path (grouped_reft) still works
    HAS_TRITON = False

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INDEX_DTYPES = (torch.int32, torch.int64)
MAX_RANK = 128  # t lives in registers: (BLOCK_M, next_pow2(r)) float32 per program


@dataclasses.dataclass(frozen=True)
class ReftTritonMeta:
    """Per-step kernel inputs: the grouping of :class:`ReftGroup` as three index tensors.

    ``row_ids`` lists every row that gets an intervention, sorted by group; group ``g``
    owns ``row_ids[group_starts[g]:group_starts[g + 1]]`` and uses intervention
    ``group_index[g]``. Groups with no rows are dropped, so ``empty`` means "launch
    nothing". ``max_group_rows`` is kept on the host to size the grid without a sync.
    """

    row_ids: torch.Tensor  # (m,) int32, rows sorted by group
    group_starts: torch.Tensor  # (G + 1,) int32 offsets into row_ids
    group_index: torch.Tensor  # (G,) int32 intervention index per group
    max_group_rows: int

    @property
    def num_groups(self) -> int:
        return int(self.group_index.numel())

    @property
    def empty(self) -> bool:
        """True on pure-decode steps etc.: callers skip ReFT work entirely."""
        return self.num_groups == 0

    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(row_ids, group_starts, group_index)``, in :func:`reft_triton`'s order."""
        return self.row_ids, self.group_starts, self.group_index

    @classmethod
    def from_groups(
        cls,
        groups: Sequence[ReftGroup],
        device: torch.device | str,
        num_rows: int | None = None,
    ) -> ReftTritonMeta:
        """Build from the torch path's groups (slices or index tensors), one host→device copy.

        ``num_rows`` resolves open or negative slices (``slice(None)``) and bounds-checks
        rows; without it slices need an explicit, non-negative ``stop``.
        """
        row_ids, starts, kept = _group_rows([g.rows for g in groups], num_rows)
        index = np.asarray([groups[g].index for g in kept], np.int64)
        if (index < 0).any():
            raise ValueError(f"intervention index must be >= 0, got {int(index.min())}")
        return cls._pack(row_ids, starts, index, device)

    @classmethod
    def from_row_index(
        cls, row_index: Sequence[int] | np.ndarray, device: torch.device | str
    ) -> ReftTritonMeta:
        """Group rows by a per-row intervention index (``-1`` = none), as ``reft_reference``."""
        idx = np.asarray(row_index, dtype=np.int64).reshape(-1)
        rows = np.flatnonzero(idx >= 0)
        order = rows[np.argsort(idx[rows], kind="stable")]
        keys = idx[order]
        first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if keys.size else keys
        starts = np.r_[first, keys.size]
        return cls._pack(order, starts, keys[first], device)

    @classmethod
    def _pack(
        cls, row_ids: np.ndarray, starts: np.ndarray, index: np.ndarray, device: torch.device | str
    ) -> ReftTritonMeta:
        """One int32 buffer, one copy to the device, three views into it."""
        m, g = row_ids.size, index.size
        buf = torch.from_numpy(np.concatenate([row_ids, starts, index]).astype(np.int32))
        buf = buf.to(device)
        sizes = np.diff(starts)
        return cls(
            row_ids=buf[:m],
            group_starts=buf[m : m + g + 1],
            group_index=buf[m + g + 1 :],
            max_group_rows=int(sizes.max()) if g else 0,
        )


@dataclasses.dataclass(frozen=True)
class ReftTritonStepMeta:
    """One step's kernel inputs for every decoder layer, in one device buffer.

    The rows are grouped once (``row_ids``, ``group_starts`` as in :class:`ReftTritonMeta`);
    ``layer_index[l, g]`` is the intervention group ``g`` uses at layer slot ``l``, ``-1``
    where it has none there (the kernel skips the group). Built with one host→device copy
    per step instead of one per layer.
    """

    row_ids: torch.Tensor  # (m,) int32, rows sorted by group
    group_starts: torch.Tensor  # (G + 1,) int32 offsets into row_ids
    layer_index: torch.Tensor  # (L, G) int32 intervention index per layer slot and group
    max_group_rows: int

    def args(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(row_ids, group_starts, group_index)`` of layer slot ``layer``, in
        :func:`reft_triton`'s order."""
        return self.row_ids, self.group_starts, self.layer_index[layer]

    @classmethod
    def from_groups(
        cls,
        rows: Sequence[slice | torch.Tensor],  # G groups' rows (host tensors or slices)
        layer_index: np.ndarray,  # (L, G) intervention per layer slot and group, -1 = none
        device: torch.device | str,
        num_rows: int | None = None,
    ) -> ReftTritonStepMeta:
        """Group the rows (empty groups dropped) and copy everything to ``device`` once."""
        layer_index = np.asarray(layer_index, np.int64).reshape(-1, len(rows))
        row_ids, starts, kept = _group_rows(rows, num_rows)
        table = layer_index[:, kept]
        m, g = row_ids.size, len(kept)
        buf = torch.from_numpy(
            np.concatenate([row_ids, starts, table.reshape(-1)]).astype(np.int32)
        ).to(device)
        sizes = np.diff(starts)
        return cls(
            row_ids=buf[:m],
            group_starts=buf[m : m + g + 1],
            layer_index=buf[m + g + 1 :].view(table.shape[0], g),
            max_group_rows=int(sizes.max()) if g else 0,
        )


def _group_rows(
    rows: Sequence[slice | torch.Tensor], num_rows: int | None
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """``(row_ids, group_starts, kept)``: the rows of the non-empty groups back to back,
    their offsets, and which groups those are. Checks that no row is in two groups."""
    chunks: list[np.ndarray] = []
    kept: list[int] = []
    for position, group_rows in enumerate(rows):
        array = _rows_array(group_rows, num_rows)
        if array.size:
            chunks.append(array)
            kept.append(position)
    sizes = np.array([c.size for c in chunks], dtype=np.int64)
    row_ids = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
    if row_ids.size and (row_ids.min() < 0 or np.unique(row_ids).size != row_ids.size):
        raise ValueError("rows must be non-negative and belong to at most one group")
    if num_rows is not None and row_ids.size and row_ids.max() >= num_rows:
        raise ValueError(f"row {int(row_ids.max())} out of range for {num_rows} rows")
    if row_ids.size and row_ids.max() >= 2**31:
        raise ValueError("row ids must fit in int32")
    return row_ids, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), kept


def _rows_array(rows: slice | torch.Tensor, num_rows: int | None) -> np.ndarray:
    if isinstance(rows, slice):
        if num_rows is not None:
            return np.arange(*rows.indices(num_rows), dtype=np.int64)
        start, stop, step = rows.start or 0, rows.stop, rows.step or 1
        if stop is None or start < 0 or stop < 0 or step <= 0:
            raise ValueError(f"slice {rows} needs num_rows to be resolved")
        return np.arange(start, stop, step, dtype=np.int64)
    return rows.detach().to("cpu", torch.int64).reshape(-1).numpy()


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def reft_triton(
    out: torch.Tensor,  # (n, d) receives the deltas, in place
    h: torch.Tensor,  # (n, d) residual stream the interventions read; may be `out` itself
    row_ids: torch.Tensor,  # (m,) int32/int64 rows, sorted by group
    group_starts: torch.Tensor,  # (G + 1,) int32/int64 offsets into row_ids
    group_index: torch.Tensor,  # (G,) int32/int64 intervention index per group
    proj_in: torch.Tensor,  # (K, r, d)
    bias: torch.Tensor,  # (K, r)
    proj_out: torch.Tensor,  # (K, r, d)
    *,
    max_group_rows: int | None = None,
    allow_tf32: bool = False,
    block_m: int | None = None,
    block_d: int | None = None,
    num_warps: int = 4,
) -> None:
    """``out[i] += (h[i] @ proj_in[k].T + bias[k]) @ proj_out[k]`` for every grouped row.

    ``h`` is cast to the weights' dtype before the first product and ``t`` before the
    second (as the torch path does); both products accumulate in float32 and the add to
    ``out`` is done in float32. float32 weights use exact (IEEE) products unless
    ``allow_tf32``. Nothing is launched when there are no groups. Pass
    ``max_group_rows`` (``ReftTritonMeta`` has it) to avoid a device→host sync.
    ``block_m``/``block_d``/``num_warps`` are tuning knobs; the defaults follow ``r``
    and the largest group.
    """
    assert h.dim() == 2 and out.shape == h.shape, (out.shape, h.shape)
    assert h.is_contiguous() and out.is_contiguous(), "h and out must be contiguous"
    assert h.dtype in _FLOAT_DTYPES and out.dtype in _FLOAT_DTYPES, (h.dtype, out.dtype)
    assert proj_in.dim() == 3 and proj_out.shape == proj_in.shape, (proj_in.shape, proj_out.shape)
    num_k, rank, d = proj_in.shape
    assert d == h.shape[1], (proj_in.shape, h.shape)
    assert bias.shape == (num_k, rank), (bias.shape, proj_in.shape)
    assert 1 <= rank <= MAX_RANK, f"rank {rank} outside 1..{MAX_RANK}"
    assert proj_in.dtype == proj_out.dtype and proj_in.dtype in _FLOAT_DTYPES, proj_in.dtype
    assert bias.dtype in _FLOAT_DTYPES, bias.dtype
    assert proj_in.is_contiguous() and proj_out.is_contiguous() and bias.is_contiguous()
    num_groups = group_index.numel()
    assert row_ids.dim() == 1 and group_index.dim() == 1, (row_ids.shape, group_index.shape)
    assert group_starts.shape == (num_groups + 1,), (group_starts.shape, num_groups)
    for t in (row_ids, group_starts, group_index):
        assert t.dtype in _INDEX_DTYPES and t.is_contiguous(), t.dtype
    tensors = (out, h, row_ids, group_starts, group_index, proj_in, bias, proj_out)
    assert len({t.device for t in tensors}) == 1, "all tensors must be on one device"
    if num_groups == 0 or row_ids.numel() == 0 or h.shape[0] == 0:
        return  # pure-decode steps: no ReFT work, not even a launch
    if not HAS_TRITON:
        raise RuntimeError("reft_triton needs triton; use preft_kernels.grouped_reft instead")
    if max_group_rows is None:  # a device→host sync; ReftTritonMeta carries it
        max_group_rows = int((group_starts[1:] - group_starts[:-1]).max().item())
    if max_group_rows <= 0:
        return

    block_r = max(16, _next_pow2(rank))
    block_m = block_m or min(64, max(16, _next_pow2(max_group_rows)))
    block_d = block_d or (128 if block_r <= 32 else 64 if block_r <= 64 else 32)
    row_blocks = triton.cdiv(max_group_rows, block_m)
    assert row_blocks < 65536, "grid axis 1 is limited to 65535 row blocks per group"
    precision = "tf32" if allow_tf32 or proj_in.dtype != torch.float32 else "ieee"
    # Triton's CPU interpreter multiplies bf16 blocks as raw bits: upcast there (tests only).
    upcast = _INTERPRETED and proj_in.dtype == torch.bfloat16
    _reft_kernel[(num_groups, row_blocks)](
        out,
        h,
        row_ids,
        group_starts,
        group_index,
        proj_in,
        bias,
        proj_out,
        d,
        rank,
        BLOCK_M=block_m,
        BLOCK_R=block_r,
        BLOCK_D=block_d,
        PRECISION="ieee" if upcast else precision,
        UPCAST=upcast,
        num_warps=num_warps,
    )


if HAS_TRITON:

    @triton.jit
    def _reft_kernel(
        out_ptr,
        h_ptr,
        row_ids_ptr,
        group_starts_ptr,
        group_index_ptr,
        proj_in_ptr,
        bias_ptr,
        proj_out_ptr,
        d,
        rank,
        BLOCK_M: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_D: tl.constexpr,
        PRECISION: tl.constexpr,
        UPCAST: tl.constexpr,
    ):
        """Program (g, b): rows ``b*BLOCK_M ..`` of group ``g``; two passes over ``d``."""
        g = tl.program_id(0)
        first = tl.load(group_starts_ptr + g) + tl.program_id(1) * BLOCK_M
        end = tl.load(group_starts_ptr + g + 1)
        if first >= end:
            return  # smaller group than the grid's largest: nothing to do
        k = tl.load(group_index_ptr + g).to(tl.int64)
        if k < 0:
            return  # this group has no intervention at this layer

        offs_m = first + tl.arange(0, BLOCK_M)
        mask_m = offs_m < end
        rows = tl.load(row_ids_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
        offs_r = tl.arange(0, BLOCK_R)
        mask_r = offs_r < rank  # r is padded to a power of two >= 16 for tl.dot
        w_base = k * rank * d
        w_dtype = proj_in_ptr.dtype.element_ty
        dot_dtype = tl.float32 if UPCAST else w_dtype

        # Pass 1: t = h[rows] @ proj_in[k].T  (BLOCK_M, BLOCK_R), float32 accumulator.
        # tl.full, not tl.zeros: library @jit helpers break the interpreter if triton was
        # imported before TRITON_INTERPRET was set (e.g. by vLLM earlier in a test session).
        t = tl.full((BLOCK_M, BLOCK_R), 0.0, tl.float32)
        for d0 in range(0, d, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            mask_d = offs_d < d
            x = tl.load(
                h_ptr + rows[:, None] * d + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :],
                other=0.0,
            )
            w = tl.load(
                proj_in_ptr + w_base + offs_r[None, :] * d + offs_d[:, None],
                mask=mask_r[None, :] & mask_d[:, None],
                other=0.0,
            )  # (BLOCK_D, BLOCK_R)
            t = tl.dot(
                x.to(w_dtype).to(dot_dtype), w.to(dot_dtype), acc=t, input_precision=PRECISION
            )
        b = tl.load(bias_ptr + k * rank + offs_r, mask=mask_r, other=0.0)
        t = (t + b.to(tl.float32)[None, :]).to(proj_out_ptr.dtype.element_ty).to(dot_dtype)

        # Pass 2: out[rows] += t @ proj_out[k], one (BLOCK_M, BLOCK_D) tile at a time.
        for d0 in range(0, d, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            mask_d = offs_d < d
            w = tl.load(
                proj_out_ptr + w_base + offs_r[:, None] * d + offs_d[None, :],
                mask=mask_r[:, None] & mask_d[None, :],
                other=0.0,
            )  # (BLOCK_R, BLOCK_D)
            delta = tl.dot(t, w.to(dot_dtype), input_precision=PRECISION)
            o_ptrs = out_ptr + rows[:, None] * d + offs_d[None, :]
            o_mask = mask_m[:, None] & mask_d[None, :]
            o = tl.load(o_ptrs, mask=o_mask, other=0.0)
            tl.store(o_ptrs, (o.to(tl.float32) + delta).to(out_ptr.dtype.element_ty), mask=o_mask)

    _INTERPRETED = type(_reft_kernel).__name__ == "InterpretedFunction"
else:
    _INTERPRETED = False


def grouped_reft_triton(
    out: torch.Tensor,  # (n, d) receives the deltas, in place
    h: torch.Tensor,  # (n, d)
    groups: Sequence[ReftGroup],  # rows as slices or host index tensors
    proj_in: torch.Tensor,  # (K, r, d)
    bias: torch.Tensor,  # (K, r)
    proj_out: torch.Tensor,  # (K, r, d)
) -> None:
    """Drop-in for ``preft_kernels.reft.grouped_reft``: same arguments, one launch per call.

    Rows should stay on the host: the metadata is packed there and copied to the device
    once, without a device→host sync. (The worker prepares a whole step's metadata once
    with :class:`ReftTritonStepMeta` instead of calling this per layer.)
    """
    if not groups:
        return
    meta = ReftTritonMeta.from_groups(groups, h.device, num_rows=h.shape[0])
    reft_triton(
        out,
        h,
        *meta.args(),
        proj_in.contiguous(),
        bias.contiguous(),
        proj_out.contiguous(),
        max_group_rows=meta.max_group_rows,
    )
