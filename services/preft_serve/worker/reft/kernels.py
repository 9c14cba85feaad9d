"""How the ReFT runtime drives a kernel: inputs prepared once per step, applied per layer.

A step's rows are grouped by (adapter, part) once; ``layer_index[slot, g]`` says which
stacked intervention group ``g`` uses at a layer (``-1``: none there). ``prepare`` turns
that into the kernel's own inputs once per step (the torch path moves index rows to the
device; the Triton path packs its metadata and copies it in one host→device transfer),
and ``apply`` runs one decoder layer with that layer's stacked weights.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from preft_kernels.reft import ReftGroup, grouped_reft

Rows = slice | torch.Tensor


class ReftKernel(Protocol):
    def prepare(
        self, rows: list[Rows], layer_index: np.ndarray, num_rows: int, device: torch.device
    ) -> Any:
        """Once per step: ``rows`` per group (host), ``layer_index`` (L, G)."""

    def apply(
        self,
        out: torch.Tensor,
        h: torch.Tensor,
        prepared: Any,
        slot: int,
        proj_in: torch.Tensor,
        bias: torch.Tensor,
        proj_out: torch.Tensor,
    ) -> None:
        """Per layer: ``out[rows(g)] += (h @ proj_in[k].T + bias[k]) @ proj_out[k]`` for
        every group ``g`` with ``k = layer_index[slot, g] >= 0``."""


class TorchReft:
    """:func:`preft_kernels.reft.grouped_reft` (CPU, or GPUs without Triton)."""

    def prepare(
        self, rows: list[Rows], layer_index: np.ndarray, num_rows: int, device: torch.device
    ) -> Any:
        on_device = [r.to(device) if isinstance(r, torch.Tensor) else r for r in rows]
        return on_device, layer_index

    def apply(
        self,
        out: torch.Tensor,
        h: torch.Tensor,
        prepared: Any,
        slot: int,
        proj_in: torch.Tensor,
        bias: torch.Tensor,
        proj_out: torch.Tensor,
    ) -> None:
        rows, layer_index = prepared
        groups = [ReftGroup(rows[g], int(k)) for g, k in enumerate(layer_index[slot]) if k >= 0]
        grouped_reft(out, h, groups, proj_in, bias, proj_out)


class TritonReft:
    """:func:`preft_kernels.reft_triton.reft_triton`: one launch per layer, its metadata
    (:class:`~preft_kernels.reft_triton.ReftTritonStepMeta`) copied once per step."""

    def prepare(
        self, rows: list[Rows], layer_index: np.ndarray, num_rows: int, device: torch.device
    ) -> Any:
        from preft_kernels.reft_triton import ReftTritonStepMeta

        return ReftTritonStepMeta.from_groups(rows, layer_index, device, num_rows=num_rows)

    def apply(
        self,
        out: torch.Tensor,
        h: torch.Tensor,
        prepared: Any,
        slot: int,
        proj_in: torch.Tensor,
        bias: torch.Tensor,
        proj_out: torch.Tensor,
    ) -> None:
        from preft_kernels.reft_triton import ReftTritonStepMeta, reft_triton

        meta: ReftTritonStepMeta = prepared
        row_ids, group_starts, group_index = meta.args(slot)
        reft_triton(
            out,
            h,
            row_ids,
            group_starts,
            group_index,
            proj_in.contiguous(),
            bias.contiguous(),
            proj_out.contiguous(),
            max_group_rows=meta.max_group_rows,
        )


def reft_kernel_for(device: torch.device | str) -> ReftKernel:
    """The Triton kernel on GPUs, the grouped torch path elsewhere."""
    if torch.device(device).type != "cuda":
        return TorchReft()
    from preft_kernels.reft_triton import HAS_TRITON

    return TritonReft() if HAS_TRITON else TorchReft()
