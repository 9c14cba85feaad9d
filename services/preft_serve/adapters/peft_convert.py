"""``preft adapter convert``: a PEFT adapter saved as ``adapter_model.bin`` -> safetensors.

The registry never unpickles anything; this runs on the tenant's machine. The pickle is read
with ``torch.load(weights_only=True)`` only, which refuses any object but tensors and plain
containers, so a malicious ``.bin`` fails to load instead of running code. torch is imported
here, not at the CLI's start, so the slim images' ``preft`` works without it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE

PICKLED_WEIGHTS = ("adapter_model.bin", "adapter_model.pt")


class ConvertError(Exception):
    """The adapter cannot be converted; the message says why."""


def _source(src: Path) -> tuple[Path, Path]:
    """(adapter_config.json, pickled weights) of a folder or of a .bin inside one."""
    if src.is_file():
        folder, weights = src.parent, src
    elif src.is_dir():
        found = [src / n for n in PICKLED_WEIGHTS if (src / n).is_file()]
        if not found:
            raise ConvertError(f"{src} has no {' or '.join(PICKLED_WEIGHTS)} to convert")
        folder, weights = src, found[0]
    else:
        raise ConvertError(f"{src} does not exist")
    config = folder / CONFIG_FILE
    if not config.is_file():
        raise ConvertError(f"{folder} lacks {CONFIG_FILE}; a PEFT adapter folder has both files")
    return config, weights


def convert_adapter(src: Path, out: Path | None = None, *, overwrite: bool = False) -> Path:
    """Write ``adapter_model.safetensors`` (and a copy of the config) into ``out``.

    ``out`` defaults to the adapter's own folder. Returns the weights file written.
    """
    import torch
    from safetensors.torch import save_file

    config, weights = _source(Path(src))
    out = Path(out) if out is not None else config.parent
    target = out / WEIGHTS_FILE
    if target.exists() and not overwrite:
        raise ConvertError(f"{target} already exists; pass --force to overwrite it")
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001  (UnpicklingError, RuntimeError, EOFError ...)
        raise ConvertError(
            f"{weights} cannot be read as tensors with "
            f"torch.load(weights_only=True): {str(exc)[:300]}"
        ) from None
    if not (
        isinstance(state, dict)
        and state
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())
    ):
        raise ConvertError(
            f"{weights} does not hold a name -> tensor mapping (a PEFT adapter's state dict)"
        )
    # Tensors may share storage (tied or sliced weights); safetensors wants each its own.
    tensors = {k: v.detach().contiguous().clone() for k, v in state.items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target), metadata={"format": "pt"})
    if out.resolve() != config.parent.resolve():
        shutil.copyfile(config, out / CONFIG_FILE)
    return target
