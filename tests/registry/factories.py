"""Test-data factories: valid adapters and deliberately broken variants of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE, AdapterMode


def lora(
    base_model_dir: Path,
    out: Path,
    seed: int,
    rank: int = 8,
    mode: AdapterMode = AdapterMode.PREFILL,
) -> Path:
    from preft_serve.toymodels import LoraSpec, make_lora_adapter

    return make_lora_adapter(base_model_dir, out, seed, LoraSpec(rank=rank, mode=mode))


def copy_adapter(src: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        shutil.copyfile(src / name, dest / name)
    return dest


def edit_config(adapter_dir: Path, **changes: Any) -> Path:
    """Set (or, with value ``...``, remove) config keys in place."""
    path = adapter_dir / CONFIG_FILE
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is ...:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))
    return adapter_dir


def edit_tensors(adapter_dir: Path, edit: Any) -> Path:
    """Apply ``edit(dict[name, ndarray]) -> dict`` to the weights in place."""
    path = adapter_dir / WEIGHTS_FILE
    tensors = dict(load_file(str(path)))
    save_file(edit(tensors), str(path))
    return adapter_dir


def reft(
    base_model_dir: Path,
    out: Path,
    reft_type: str = "loreft",
    rank: int = 4,
    layers: tuple[int, ...] = (0, 1),
    positions: str = "f1+l1",
    share: bool = True,
    seed: int = 0,
    dtype: Any = np.float32,
) -> Path:
    """A valid DiReFT/LoReFT adapter per docs/adapters.md (LoReFT ``r`` orthonormal)."""
    hidden = json.loads((base_model_dir / "config.json").read_text())["hidden_size"]
    rng = np.random.default_rng(seed)
    parts = ["shared"] if share or positions == "prefill" else ["first", "last"]
    tensors: dict[str, np.ndarray] = {}
    for layer in layers:
        for part in parts:
            p = f"layers.{layer}.{part}"
            if reft_type == "direft":
                tensors[f"{p}.w1"] = rng.normal(0, 0.3, (rank, hidden))
                tensors[f"{p}.b"] = rng.normal(0, 0.3, (rank,))
                tensors[f"{p}.w2"] = rng.normal(0, 0.3, (rank, hidden))
            else:
                q, _ = np.linalg.qr(rng.normal(size=(hidden, rank)))
                tensors[f"{p}.r"] = q.T
                tensors[f"{p}.w"] = rng.normal(0, 0.3, (rank, hidden))
                tensors[f"{p}.b"] = rng.normal(0, 0.3, (rank,))
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: np.ascontiguousarray(v.astype(dtype)) for k, v in tensors.items()},
        str(out / WEIGHTS_FILE),
    )
    config = {
        "peft_type": "REFT",
        "reft_type": reft_type,
        "rank": rank,
        "layers": list(layers),
        "positions": positions,
        "share_weights": share,
        "base_model_name_or_path": str(base_model_dir),
        "preft_mode": "prefill",
    }
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    return out


def cast(adapter_dir: Path, dtype: str) -> Path:
    """Re-save the weights as ``torch.<dtype>`` (numpy has no bfloat16)."""
    import torch
    from safetensors.torch import load_file as load_pt
    from safetensors.torch import save_file as save_pt

    path = adapter_dir / WEIGHTS_FILE
    tensors = load_pt(str(path))
    save_pt({k: v.to(getattr(torch, dtype)).contiguous() for k, v in tensors.items()}, str(path))
    return adapter_dir
