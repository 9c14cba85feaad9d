"""Grouped low-rank ReFT interventions on the residual stream (CPU / torch path).

Both ReFT types reduce to one op per (adapter, part) group of rows::

    delta[i] = (h[i] @ proj_in[k].T + bias[k]) @ proj_out[k]
    out[i]  += delta[i]

* DiReFT  ``h + W2ᵀ(W1·h + b)``:          proj_in = W1, bias = b, proj_out = W2
* LoReFT  ``h + Rᵀ(W·h + b − R·h)``:      proj_in = W − R, bias = b, proj_out = R

``h`` is the full residual stream at a decoder layer's output; ``out`` is the tensor the
delta is added to (vLLM keeps the stream as ``hidden_states + residual``, so adding to
``hidden_states`` shifts the stream by ``delta``). Shapes: ``proj_in``/``proj_out``
``(K, r, d)``, ``bias`` ``(K, r)`` for K loaded interventions of rank ``r``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

Rows = slice | torch.Tensor


@dataclasses.dataclass(frozen=True)
class ReftGroup:
    """Rows of the step that get intervention ``index`` (into the stacked weights)."""

    rows: Rows
    index: int


def grouped_reft(
    out: torch.Tensor,  # (n, d) receives the deltas, in place
    h: torch.Tensor,  # (n, d) residual stream the interventions read
    groups: Sequence[ReftGroup],
    proj_in: torch.Tensor,  # (K, r, d)
    bias: torch.Tensor,  # (K, r)
    proj_out: torch.Tensor,  # (K, r, d)
) -> None:
    """``out[rows] += (h[rows] @ proj_in[k].T + bias[k]) @ proj_out[k]`` per group."""
    assert out.shape == h.shape and h.dim() == 2, (out.shape, h.shape)
    assert proj_in.shape == proj_out.shape and proj_in.shape[-1] == h.shape[-1]
    for group in groups:
        k = group.index
        hs = h[group.rows].to(proj_in.dtype)
        delta = (hs @ proj_in[k].T + bias[k]) @ proj_out[k]
        if isinstance(group.rows, slice):
            out[group.rows] += delta.to(out.dtype)
        else:
            out.index_add_(0, group.rows, delta.to(out.dtype))


def reft_reference(
    h: torch.Tensor,  # (n, d)
    row_index: Sequence[int],  # per row: intervention index, -1 = none
    proj_in: torch.Tensor,
    bias: torch.Tensor,
    proj_out: torch.Tensor,
) -> torch.Tensor:
    """float64, row by row: the deltas ``grouped_reft`` must add."""
    delta = torch.zeros_like(h, dtype=torch.float64)
    for i, k in enumerate(row_index):
        if k >= 0:
            x = h[i].double()
            delta[i] = (proj_in[k].double() @ x + bias[k].double()) @ proj_out[k].double()
    return delta
