"""Plain float64 references for the kernels: a loop over rows, obviously correct."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def lora_linear_reference(
    y: torch.Tensor,  # (num_rows, sum(output_slices))
    x: torch.Tensor,  # (num_rows, in)
    a_stacked: Sequence[torch.Tensor],  # per slice: (slots, 1, rank, in)
    b_stacked: Sequence[torch.Tensor],  # per slice: (slots, 1, out_s, rank)
    slots: Sequence[int],  # per row; -1 = no adapter
    scale: float,
    output_slices: Sequence[int],
) -> torch.Tensor:
    """Returns ``y + LoRA(x)`` in float64 without modifying ``y``."""
    out = y.double().clone()
    for i, slot in enumerate(slots):
        if slot < 0:
            continue
        offset = 0
        for a, b, size in zip(a_stacked, b_stacked, output_slices):
            wa, wb = a[slot, 0].double(), b[slot, 0].double()
            out[i, offset : offset + size] += scale * (wb @ (wa @ x[i].double()))
            offset += size
    return out
