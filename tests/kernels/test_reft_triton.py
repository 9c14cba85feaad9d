"""Triton ReFT kernel against the float64 reference and the torch grouped path.

Without a GPU the kernel runs in Triton's CPU interpreter: ``TRITON_INTERPRET`` is set while
``preft_kernels.reft_triton`` is imported (the interpreter is chosen when the kernel is
decorated) and while this module's tests run (Triton checks it again at call time), and
restored otherwise, so the rest of the session is unaffected. Shapes stay small because the
interpreter runs each program's block ops in numpy.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from preft_kernels.reft import ReftGroup, grouped_reft, reft_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _import_kernel() -> ModuleType:
    name = "preft_kernels.reft_triton"
    if DEVICE == "cuda":
        return importlib.import_module(name)
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        module = importlib.import_module(name)
        if not module._INTERPRETED:  # imported earlier without the interpreter
            module = importlib.reload(module)
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved
    return module


rt = _import_kernel()


@pytest.fixture(autouse=True, scope="module")
def _interpreter() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        if DEVICE == "cpu":
            mp.setenv("TRITON_INTERPRET", "1")
        yield


def row_layout(rng: np.random.Generator, n: int, k: int, kind: str) -> np.ndarray:
    """Per-row intervention index, -1 = none."""
    if kind == "segments":  # one request's tokens after another
        return np.repeat(rng.integers(-1, k, size=n), rng.integers(1, 9, size=n))[:n]
    if kind == "single":  # decode-like: every row its own group
        idx = rng.permutation(max(n, k))[:n] % k
        idx[rng.random(n) < 0.25] = -1
        return idx
    if kind == "one-big":  # one group spanning several row blocks, plus strays
        idx = np.zeros(n, dtype=np.int64)
        idx[rng.random(n) < 0.1] = -1
        idx[-3:] = k - 1
        return idx
    return rng.integers(-1, k, size=n)  # "interleaved": non-contiguous rows everywhere


def groups_from_index(idx: np.ndarray) -> list[ReftGroup]:
    """The torch path's groups: slices where a group's rows are contiguous, else tensors."""
    groups = []
    for k in np.unique(idx[idx >= 0]).tolist():
        rows = np.flatnonzero(idx == k)
        if rows[-1] - rows[0] + 1 == rows.size:
            groups.append(ReftGroup(slice(int(rows[0]), int(rows[-1]) + 1), k))
        else:
            groups.append(ReftGroup(torch.from_numpy(rows).to(DEVICE), k))
    return groups


def weights(
    k: int, r: int, d: int, gen: torch.Generator, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scaled so deltas are O(1) at every d and r."""
    proj_in = torch.randn(k, r, d, generator=gen) / d**0.5
    bias = torch.randn(k, r, generator=gen)
    proj_out = torch.randn(k, r, d, generator=gen) / r**0.5
    return tuple(t.to(DEVICE, dtype) for t in (proj_in, bias, proj_out))  # type: ignore[return-value]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-30))


# (d, rank, interventions, rows, layout): real hidden sizes (896 = Qwen2.5-0.5B), ranks that
# are and are not powers of two, d not a multiple of the d block, 64 interleaved adapters.
CASES = [
    (64, 1, 2, 9, "segments"),
    (100, 4, 3, 17, "interleaved"),
    (128, 12, 5, 40, "segments"),
    (128, 16, 8, 8, "single"),
    (128, 32, 4, 70, "one-big"),
    (64, 64, 3, 20, "interleaved"),
    (896, 4, 7, 50, "segments"),
    (896, 16, 64, 200, "interleaved"),
]


@pytest.mark.parametrize("d,r,k,n,kind", CASES)
def test_matches_reference_and_torch_path(d: int, r: int, k: int, n: int, kind: str) -> None:
    gen = torch.Generator().manual_seed(d * 1000 + r * 10 + k)
    idx = row_layout(np.random.default_rng(n + r), n, k, kind)
    proj_in, bias, proj_out = weights(k, r, d, gen)
    h = torch.randn(n, d, generator=gen).to(DEVICE)
    out = torch.randn(n, d, generator=gen).to(DEVICE)
    before = out.clone()
    groups = groups_from_index(idx)
    meta = rt.ReftTritonMeta.from_groups(groups, DEVICE)

    rt.reft_triton(
        out, h, *meta.args(), proj_in, bias, proj_out, max_group_rows=meta.max_group_rows
    )

    delta = reft_reference(h, idx.tolist(), proj_in, bias, proj_out)
    assert rel_err(out - before, delta) < 1e-5
    torch_path = before.clone()
    grouped_reft(torch_path, h, groups, proj_in, bias, proj_out)
    torch.testing.assert_close(out, torch_path, rtol=1e-5, atol=1e-5)
    untouched = torch.from_numpy(idx < 0).to(DEVICE)
    assert torch.equal(out[untouched], before[untouched])


def test_no_groups_launches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoLaunch:
        def __getitem__(self, grid: object) -> object:
            raise AssertionError("kernel launched for an empty step")

    monkeypatch.setattr(rt, "_reft_kernel", NoLaunch())
    proj_in, bias, proj_out = weights(2, 4, 64, torch.Generator().manual_seed(0))
    h = torch.randn(5, 64).to(DEVICE)
    out = h.clone()
    for groups in ([], [ReftGroup(slice(2, 2), 0), ReftGroup(torch.zeros(0, dtype=torch.long), 1)]):
        meta = rt.ReftTritonMeta.from_groups(groups, DEVICE)
        assert meta.empty and meta.max_group_rows == 0
        rt.reft_triton(out, h, *meta.args(), proj_in, bias, proj_out)
    empty = torch.zeros(0, 64, device=DEVICE)
    meta = rt.ReftTritonMeta.from_row_index([], DEVICE)
    rt.reft_triton(empty, empty, *meta.args(), proj_in, bias, proj_out)
    assert torch.equal(out, h)


@pytest.mark.parametrize(
    "act,wt",
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float32),
        (torch.float32, torch.bfloat16),
    ],
)
def test_half_precision(act: torch.dtype, wt: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    idx = row_layout(np.random.default_rng(3), 40, 5, "interleaved")
    proj_in, bias, proj_out = weights(5, 12, 128, gen, wt)
    h = torch.randn(40, 128, generator=gen).to(DEVICE, act)
    out = torch.randn(40, 128, generator=gen).to(DEVICE, act)
    before = out.clone()
    groups = groups_from_index(idx)
    meta = rt.ReftTritonMeta.from_groups(groups, DEVICE)
    rt.reft_triton(out, h, *meta.args(), proj_in, bias, proj_out)  # max_group_rows via sync

    delta = reft_reference(h, idx.tolist(), proj_in, bias, proj_out)
    assert rel_err(out.double() - before.double(), delta) < 2e-2
    torch_path = before.clone()
    grouped_reft(torch_path, h, groups, proj_in, bias, proj_out)
    assert rel_err(out.double() - before.double(), torch_path.double() - before.double()) < 2e-2
    untouched = torch.from_numpy(idx < 0).to(DEVICE)
    assert torch.equal(out[untouched], before[untouched])


def test_in_place_on_h_and_small_blocks_span_many_row_blocks() -> None:
    """``out`` may be ``h`` (each program reads its rows before writing them)."""
    gen = torch.Generator().manual_seed(5)
    idx = row_layout(np.random.default_rng(5), 60, 2, "one-big")
    proj_in, bias, proj_out = weights(2, 8, 96, gen)
    h = torch.randn(60, 96, generator=gen).to(DEVICE)
    want = h.double() + reft_reference(h, idx.tolist(), proj_in, bias, proj_out)
    meta = rt.ReftTritonMeta.from_row_index(idx, DEVICE)
    rt.reft_triton(
        h,
        h,
        *meta.args(),
        proj_in,
        bias,
        proj_out,
        max_group_rows=meta.max_group_rows,
        block_m=16,
        block_d=32,
    )
    assert rel_err(h, want) < 1e-6


def test_rows_outside_groups_are_never_read() -> None:
    gen = torch.Generator().manual_seed(9)
    proj_in, bias, proj_out = weights(3, 4, 64, gen)
    h = torch.randn(12, 64, generator=gen).to(DEVICE)
    idx = np.array([0, 0, -1, 1, -1, 2, 2, 2, -1, 1, 0, -1])
    h[torch.from_numpy(idx < 0).to(DEVICE)] = float("nan")
    out = h.clone()
    meta = rt.ReftTritonMeta.from_row_index(idx, DEVICE)
    rt.reft_triton(out, h, *meta.args(), proj_in, bias, proj_out)
    grouped = torch.from_numpy(idx >= 0).to(DEVICE)
    assert torch.isfinite(out[grouped]).all() and torch.isnan(out[~grouped]).all()


def test_meta_from_groups_and_from_row_index_agree() -> None:
    groups = [
        ReftGroup(slice(4, 6), 3),
        ReftGroup(torch.tensor([0, 2, 7]), 1),
        ReftGroup(slice(9, 9), 5),
        ReftGroup(slice(1, 2), 0),
    ]
    meta = rt.ReftTritonMeta.from_groups(groups, "cpu")
    assert meta.row_ids.tolist() == [4, 5, 0, 2, 7, 1]
    assert meta.group_starts.tolist() == [0, 2, 5, 6]
    assert meta.group_index.tolist() == [3, 1, 0]
    assert meta.max_group_rows == 3 and meta.num_groups == 3
    assert all(t.dtype == torch.int32 for t in meta.args())

    by_index = rt.ReftTritonMeta.from_row_index([1, 0, 1, -1, 3, 3, -1, 1], "cpu")
    assert by_index.row_ids.tolist() == [1, 0, 2, 7, 4, 5]
    assert by_index.group_starts.tolist() == [0, 1, 4, 6]
    assert by_index.group_index.tolist() == [0, 1, 3]

    tail = rt.ReftTritonMeta.from_groups([ReftGroup(slice(-2, None), 0)], "cpu", num_rows=5)
    assert tail.row_ids.tolist() == [3, 4]


@pytest.mark.parametrize(
    "groups,num_rows",
    [
        ([ReftGroup(slice(0, 3), 0), ReftGroup(torch.tensor([2]), 1)], None),  # overlap
        ([ReftGroup(slice(0, 2), -1)], None),  # negative index
        ([ReftGroup(slice(0, None), 0)], None),  # open slice without num_rows
        ([ReftGroup(torch.tensor([5]), 0)], 5),  # out of range
    ],
)
def test_meta_rejects_bad_groups(groups: list[ReftGroup], num_rows: int | None) -> None:
    with pytest.raises(ValueError):
        rt.ReftTritonMeta.from_groups(groups, "cpu", num_rows=num_rows)


def test_wrapper_rejects_bad_inputs() -> None:
    proj_in, bias, proj_out = weights(2, 4, 64, torch.Generator().manual_seed(0))
    meta = rt.ReftTritonMeta.from_row_index([0, 1], DEVICE)
    h = torch.randn(2, 64, device=DEVICE)
    with pytest.raises(AssertionError):  # non-contiguous activations
        transposed = torch.randn(64, 2, device=DEVICE).T
        rt.reft_triton(transposed, h, *meta.args(), proj_in, bias, proj_out)
    with pytest.raises(AssertionError):  # hidden size mismatch
        rt.reft_triton(
            h[:, :32].contiguous(), h[:, :32].contiguous(), *meta.args(), proj_in, bias, proj_out
        )
    with pytest.raises(AssertionError):  # bias of the wrong rank
        rt.reft_triton(h.clone(), h, *meta.args(), proj_in, bias[:, :2].contiguous(), proj_out)


def test_grouped_api_wrapper_is_a_drop_in_for_the_torch_path() -> None:
    """What the worker calls on GPUs: grouped_reft's arguments, host-side rows."""
    gen = torch.Generator().manual_seed(5)
    idx = row_layout(np.random.default_rng(5), 30, 4, "interleaved")
    proj_in, bias, proj_out = weights(4, 8, 64, gen)
    h = torch.randn(30, 64, generator=gen).to(DEVICE)
    groups = [
        ReftGroup(g.rows.cpu() if isinstance(g.rows, torch.Tensor) else g.rows, g.index)
        for g in groups_from_index(idx)
    ]
    want, got = h.clone(), h.clone()
    grouped_reft(want, h, groups_from_index(idx), proj_in, bias, proj_out)
    rt.grouped_reft_triton(got, h, groups, proj_in, bias, proj_out)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    untouched = h.clone()
    rt.grouped_reft_triton(untouched, h, [], proj_in, bias, proj_out)
    assert torch.equal(untouched, h)


def test_step_meta_groups_rows_once_and_indexes_per_layer() -> None:
    rows = [slice(4, 6), torch.tensor([0, 2, 7]), slice(9, 9), slice(1, 2)]
    table = np.array([[0, 1, 2, -1], [-1, 0, -1, 1]])
    meta = rt.ReftTritonStepMeta.from_groups(rows, table, "cpu", num_rows=10)
    assert meta.row_ids.tolist() == [4, 5, 0, 2, 7, 1]  # the empty group is dropped
    assert meta.group_starts.tolist() == [0, 2, 5, 6]
    assert meta.layer_index.tolist() == [[0, 1, -1], [-1, 0, 1]]
    assert meta.max_group_rows == 3
    assert meta.args(1)[2].tolist() == [-1, 0, 1]
    # One buffer on the device: the per-layer index is a view, not a copy per layer.
    assert (
        meta.layer_index.untyped_storage().data_ptr() == meta.row_ids.untyped_storage().data_ptr()
    )


def test_negative_group_index_skips_the_group() -> None:
    gen = torch.Generator().manual_seed(9)
    proj_in, bias, proj_out = weights(2, 4, 64, gen)
    h = torch.randn(6, 64, generator=gen).to(DEVICE)
    table = np.array([[1, -1]])
    meta = rt.ReftTritonStepMeta.from_groups([slice(0, 3), slice(3, 6)], table, DEVICE)
    got, want = h.clone(), h.clone()
    rt.reft_triton(
        got, h, *meta.args(0), proj_in, bias, proj_out, max_group_rows=meta.max_group_rows
    )
    grouped_reft(want, h, [ReftGroup(slice(0, 3), 1)], proj_in, bias, proj_out)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[3:], h[3:])


def _runtime_adapters(hidden: int, gen: torch.Generator) -> dict[int, Any]:
    from preft_serve.adapters.format import AdapterType
    from preft_serve.worker.reft.adapter import Intervention, ReftAdapter

    def part(rank: int) -> Intervention:
        proj_in, bias, proj_out = (t[0] for t in weights(1, rank, hidden, gen))
        return Intervention(proj_in, bias, proj_out)

    def both(rank: int) -> tuple[Intervention, Intervention]:
        return part(rank), part(rank)

    return {  # adapter id -> adapter: different ranks, layers and positions
        1: ReftAdapter(AdapterType.DIREFT, 4, None, {0: both(4), 2: both(4)}),
        2: ReftAdapter(AdapterType.LOREFT, 2, (2, 1), {1: both(2), 2: both(2)}),
        3: ReftAdapter(AdapterType.DIREFT, 3, (1, 0), {0: both(3)}),
    }


def test_runtime_prepares_kernel_inputs_once_per_step_and_matches_the_torch_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's ReFT runtime with the Triton kernel: one metadata build (one
    host→device copy) per step for all decoder layers, and the torch path's results."""
    from preft_serve.worker.reft.kernels import TorchReft, TritonReft
    from preft_serve.worker.reft.runtime import ReftRuntime

    hidden, layers = 64, 4
    adapters = _runtime_adapters(hidden, torch.Generator().manual_seed(3))
    builds: list[int] = []
    build = rt.ReftTritonStepMeta.from_groups.__func__  # type: ignore[attr-defined]

    def counted(cls: type, *args: Any, **kwargs: Any) -> Any:
        builds.append(1)
        return build(cls, *args, **kwargs)

    monkeypatch.setattr(rt.ReftTritonStepMeta, "from_groups", classmethod(counted))
    # Requests: adapter 1 (prefill, 5 tokens), none (decode), adapter 2 (7), adapter 3 (4),
    # adapter 1 again (a later chunk of a 9-token prompt: 3 prompt tokens + 1 decode).
    step = (
        np.array([1, 0, 2, 3, 1]),
        np.array([0, 10, 0, 0, 6]),
        np.array([5, 10, 7, 4, 9]),
        np.array([5, 1, 7, 4, 4]),
    )
    results = {}
    for name, kernel in (("torch", TorchReft()), ("triton", TritonReft())):
        runtime = ReftRuntime(hidden, layers, capacity=8, device=DEVICE, kernel=kernel)
        runtime.adapters.update(adapters)
        ids, computed, prompt, scheduled = step
        runtime.prepare_step(ids, dict.fromkeys(adapters, "(loaded)"), computed, prompt, scheduled)
        gen = torch.Generator().manual_seed(11)
        hidden_states = torch.randn(int(scheduled.sum()), hidden, generator=gen).to(DEVICE)
        residual = torch.randn(int(scheduled.sum()), hidden, generator=gen).to(DEVICE)
        for layer in range(layers):
            runtime._make_hook(layer)(None, None, (hidden_states, residual))
        results[name] = hidden_states
    assert builds == [1]
    torch.testing.assert_close(results["triton"], results["torch"], rtol=1e-5, atol=1e-5)
