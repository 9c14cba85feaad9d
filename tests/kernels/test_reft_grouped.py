"""Torch grouped ReFT path (``grouped_reft``) against the float64 row-by-row reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from preft_kernels.reft import ReftGroup, grouped_reft, reft_reference


def weights(
    k: int, r: int, d: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.randn(k, r, d, generator=gen) / d**0.5,
        torch.randn(k, r, generator=gen),
        torch.randn(k, r, d, generator=gen) / r**0.5,
    )


def groups_for(idx: np.ndarray, as_slices: bool) -> list[ReftGroup]:
    """Contiguous groups as slices (when asked), everything else as index tensors."""
    groups = []
    for k in np.unique(idx[idx >= 0]).tolist():
        rows = np.flatnonzero(idx == k)
        if as_slices and rows[-1] - rows[0] + 1 == rows.size:
            groups.append(ReftGroup(slice(int(rows[0]), int(rows[-1]) + 1), k))
        else:
            groups.append(ReftGroup(torch.from_numpy(rows), k))
    return groups


@pytest.mark.parametrize("d,r", [(64, 1), (128, 12), (896, 16)])
@pytest.mark.parametrize("kind", ["segments", "interleaved"])
@pytest.mark.parametrize("as_slices", [True, False])
def test_matches_float64_reference(d: int, r: int, kind: str, as_slices: bool) -> None:
    gen = torch.Generator().manual_seed(d + r)
    rng = np.random.default_rng(d * r)
    k, n = 6, 48
    if kind == "segments":
        idx = np.repeat(rng.integers(-1, k, size=12), 4)
    else:
        idx = rng.integers(-1, k, size=n)
    proj_in, bias, proj_out = weights(k, r, d, gen)
    h = torch.randn(n, d, generator=gen)
    out = torch.randn(n, d, generator=gen)
    want = out.double() + reft_reference(h, idx.tolist(), proj_in, bias, proj_out)
    grouped_reft(out, h, groups_for(idx, as_slices), proj_in, bias, proj_out)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    untouched = torch.from_numpy(idx < 0)
    assert torch.equal(out[untouched].double(), want[untouched])


def test_no_groups_changes_nothing() -> None:
    proj_in, bias, proj_out = weights(2, 4, 64, torch.Generator().manual_seed(0))
    h = torch.randn(5, 64)
    out = h.clone()
    grouped_reft(out, h, [], proj_in, bias, proj_out)
    grouped_reft(out, h, [ReftGroup(slice(3, 3), 0)], proj_in, bias, proj_out)
    assert torch.equal(out, h)
    assert torch.count_nonzero(reft_reference(h, [-1] * 5, proj_in, bias, proj_out)) == 0


def test_half_precision_activations_with_float32_weights() -> None:
    gen = torch.Generator().manual_seed(1)
    proj_in, bias, proj_out = weights(3, 8, 128, gen)
    idx = np.array([0, 0, 2, -1, 1, 1, 2, 0])
    h = torch.randn(8, 128, generator=gen).bfloat16()
    out = torch.randn(8, 128, generator=gen).bfloat16()
    want = out.double() + reft_reference(h, idx.tolist(), proj_in, bias, proj_out)
    before = out.clone()
    grouped_reft(out, h, groups_for(idx, True), proj_in, bias, proj_out)
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)
    assert torch.equal(out[3], before[3])


def test_reference_is_the_documented_formula() -> None:
    """One row by hand: ``(W_in h + b) @ W_out``."""
    proj_in = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])  # (1, 2, 2)
    bias = torch.tensor([[0.5, -1.0]])
    proj_out = torch.tensor([[[1.0, 1.0], [0.0, 3.0]]])
    h = torch.tensor([[2.0, 1.0]])
    # t = [2 + 0.5, 2 - 1] = [2.5, 1]; delta = 2.5*[1, 1] + 1*[0, 3] = [2.5, 5.5]
    assert reft_reference(h, [0], proj_in, bias, proj_out).tolist() == [[2.5, 5.5]]
