"""Deterministic ReFT adapters (DiReFT / LoReFT) in the format of docs/adapters.md."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from preft_serve.adapters.format import (
    CONFIG_FILE,
    MODE_KEY,
    REFT_TYPE_KEY,
    WEIGHTS_FILE,
    AdapterMode,
    AdapterType,
)


@dataclasses.dataclass(frozen=True)
class ReftSpec:
    """Shape and placement of a generated ReFT adapter."""

    type: AdapterType = AdapterType.DIREFT
    rank: int = 4
    layers: tuple[int, ...] = (0, 1)
    positions: str = "f3+l3"
    share_weights: bool = False
    std: float = 0.3


def make_reft_adapter(
    model_dir: str | Path, directory: str | Path, seed: int, spec: ReftSpec = ReftSpec()
) -> Path:
    """Write a ReFT adapter for the model in ``model_dir``; LoReFT's R has orthonormal rows."""
    import torch
    from safetensors.torch import save_file

    model_dir, directory = Path(model_dir), Path(directory)
    hidden = json.loads((model_dir / "config.json").read_text())["hidden_size"]
    gen = torch.Generator().manual_seed(seed)
    shared = spec.share_weights or spec.positions == "prefill"
    parts = ("shared",) if shared else ("first", "last")
    tensors = {}

    def randn(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * spec.std).contiguous()

    for layer in spec.layers:
        for part in parts:
            prefix = f"layers.{layer}.{part}"
            if spec.type is AdapterType.DIREFT:
                tensors.update(
                    {
                        f"{prefix}.w1": randn(spec.rank, hidden),
                        f"{prefix}.b": randn(spec.rank),
                        f"{prefix}.w2": randn(spec.rank, hidden),
                    }
                )
            else:
                q, _ = torch.linalg.qr(torch.randn(hidden, spec.rank, generator=gen))
                tensors.update(
                    {
                        f"{prefix}.r": q.T.contiguous(),
                        f"{prefix}.w": randn(spec.rank, hidden),
                        f"{prefix}.b": randn(spec.rank),
                    }
                )
    config = {
        "peft_type": "REFT",
        REFT_TYPE_KEY: AdapterType(spec.type).value,
        "rank": spec.rank,
        "layers": list(spec.layers),
        "positions": spec.positions,
        "share_weights": shared,
        "base_model_name_or_path": str(model_dir),
        MODE_KEY: AdapterMode.PREFILL.value,
    }
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / WEIGHTS_FILE))
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
    return directory
