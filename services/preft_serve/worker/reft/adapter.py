"""Loads a ReFT adapter directory (docs/adapters.md) into per-layer low-rank interventions."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from preft_serve.adapters.families import Runtime, family_of
from preft_serve.adapters.format import (
    WEIGHTS_FILE,
    AdapterFormatError,
    AdapterType,
    adapter_type,
    read_config,
)
from preft_serve.adapters.reft_format import (
    FIRST,
    LAST,
    SHARED,
    parse_positions,
    shares_weights,
    tensor_prefix,
)


@dataclasses.dataclass(frozen=True)
class Intervention:
    """``delta = (h @ proj_in.T + bias) @ proj_out`` (see preft_kernels.reft)."""

    proj_in: torch.Tensor  # (r, d)
    bias: torch.Tensor  # (r,)
    proj_out: torch.Tensor  # (r, d)


@dataclasses.dataclass(frozen=True)
class ReftAdapter:
    """A loaded ReFT adapter: interventions by layer and by part (first/last)."""

    kind: AdapterType
    rank: int
    positions: tuple[int, int] | None  # None: every prompt token
    layers: dict[int, tuple[Intervention, Intervention]]  # layer -> (first, last) parts

    def intervention(self, layer: int, part_code: int) -> Intervention | None:
        parts = self.layers.get(layer)
        return None if parts is None else parts[part_code]


def _tensor(weights: dict[str, torch.Tensor], key: str, shape: tuple[int, ...]) -> torch.Tensor:
    if key not in weights:
        raise AdapterFormatError(f"missing tensor {key!r}")
    t = weights[key]
    if tuple(t.shape) != shape:
        raise AdapterFormatError(f"tensor {key!r} has shape {tuple(t.shape)}, expected {shape}")
    return t.float()


def _intervention(
    kind: AdapterType, weights: dict[str, torch.Tensor], prefix: str, rank: int, hidden: int
) -> Intervention:
    family = family_of(kind)
    assert family.intervention is not None  # every ReFT family has one (register_family)
    tensors = {
        suffix: _tensor(weights, f"{prefix}.{suffix}", (rank, hidden) if shape == "rd" else (rank,))
        for suffix, shape in family.reft_tensors.items()
    }
    return Intervention(*family.intervention(tensors))


def load_reft_adapter(directory: str | Path, hidden_size: int, num_layers: int) -> ReftAdapter:
    """Read and shape-check a ReFT adapter for a model with ``hidden_size``/``num_layers``."""
    from safetensors.torch import load_file

    directory = Path(directory)
    config = read_config(directory)
    kind = adapter_type(config)
    if family_of(kind).runtime is not Runtime.REFT:
        raise AdapterFormatError(f"{directory} is a {family_of(kind).label} adapter, not ReFT")
    rank = int(config["rank"])
    positions = parse_positions(str(config.get("positions", "prefill")))
    layers = [int(x) for x in config["layers"]]
    if any(not 0 <= layer < num_layers for layer in layers):
        raise AdapterFormatError(f"layers {layers} out of range for a {num_layers}-layer model")
    shared = shares_weights(config)
    weights = load_file(str(directory / WEIGHTS_FILE))
    loaded: dict[int, tuple[Intervention, Intervention]] = {}
    for layer in layers:
        if shared:
            one = _intervention(kind, weights, tensor_prefix(layer, SHARED), rank, hidden_size)
            loaded[layer] = (one, one)
        else:
            first, last = (
                _intervention(kind, weights, tensor_prefix(layer, part), rank, hidden_size)
                for part in (FIRST, LAST)
            )
            loaded[layer] = (first, last)
    return ReftAdapter(kind, rank, positions, loaded)
