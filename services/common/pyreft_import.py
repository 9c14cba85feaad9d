"""Convert a pyreft-trained ReFT checkpoint into preft-serve's ReFT format, without pickle.

pyreft (via pyvene) saves one ``intkey_<key>.bin`` per intervention with ``torch.save``.
These files are pickles, but of plain tensor dicts, so ``torch.load(weights_only=True)``
reads them without executing code; anything else in the file is refused. The mapping
(docs/reft.md):

* LoReFT ``h + Rᵀ(Wh + b − Rh)``: pyreft stores ``weight``/``bias`` (W, b of
  ``learned_source``) and ``rotate_layer`` (d × r, columns orthonormal) → ``w``, ``b``,
  ``r = rotate_layerᵀ``.
* DiReFT ``h + W2ᵀ(W1·h + b)``: pyreft stores ``learned_source.weight/bias`` (W1, b) and
  the orthogonal parametrisation of ``rotate_layer`` (``...parametrizations.weight.*``),
  which is re-materialised with torch's own ``orthogonal`` → ``w2 = weightᵀ``.
* The layer comes from the key (``layer.<L>`` / ``layer_<L>``); with separate weights for
  first/last positions, pyreft's ``#0`` intervention of a layer is the ``first`` part and
  ``#1`` the ``last`` part. Only pyreft's default linear activation is supported.

Usage: ``python -m preft_serve.common.pyreft_import PYREFT_DIR OUT_DIR --reft-type loreft
--positions f7+l7 --base-model NAME``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch
from preft_serve.common.adapter_format import (
    CONFIG_FILE,
    MODE_KEY,
    WEIGHTS_FILE,
    AdapterFormatError,
)

_LAYER = re.compile(r"layer[._](\d+)")
_INDEX = re.compile(r"#(\d+)$")


def _rotation_from_parametrization(state: dict[str, torch.Tensor]) -> torch.Tensor:
    """Rebuild pyreft's ``orthogonal(LowRankRotateLayer)`` and read its weight (d × r)."""
    original = state["rotate_layer.parametrizations.weight.original"]
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.empty_like(original))
    layer = torch.nn.utils.parametrizations.orthogonal(layer)
    sub = {k.removeprefix("rotate_layer."): v for k, v in state.items()
           if k.startswith("rotate_layer.")}
    layer.load_state_dict(sub, strict=False)
    weight = layer.weight  # a parametrization: computed on access
    assert isinstance(weight, torch.Tensor)
    with torch.no_grad():
        return weight.detach().clone()


def convert_intervention(kind: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One pyreft intervention state dict -> our tensor suffixes (``w1,b,w2`` / ``r,w,b``)."""
    if "rotate_layer" in state:  # LoReFT's compact state_dict override
        rotation = state["rotate_layer"]
        weight, bias = state["weight"], state["bias"]
    elif "rotate_layer.parametrizations.weight.original" in state:
        rotation = _rotation_from_parametrization(state)
        weight, bias = state["learned_source.weight"], state["learned_source.bias"]
    else:
        raise AdapterFormatError(f"not a pyreft LoReFT/DiReFT state dict: keys {sorted(state)}")
    r = rotation[:, : weight.shape[0]].T.contiguous().float()
    if kind == "loreft":
        return {"r": r, "w": weight.float().contiguous(), "b": bias.float().contiguous()}
    if kind == "direft":
        return {"w1": weight.float().contiguous(), "b": bias.float().contiguous(), "w2": r}
    raise AdapterFormatError(f"reft type must be 'direft' or 'loreft' (got {kind!r})")


def convert(src: Path, dst: Path, kind: str, positions: str, base_model: str,
            share_weights: bool) -> Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` for a pyreft directory."""
    from safetensors.torch import save_file

    files = sorted(src.glob("intkey_*.bin"))
    if not files:
        raise AdapterFormatError(f"no intkey_*.bin files in {src}: is it a pyreft save dir?")
    tensors: dict[str, torch.Tensor] = {}
    layers: set[int] = set()
    rank = 0
    for path in files:
        key = path.stem.removeprefix("intkey_")
        layer_match = _LAYER.search(key)
        if not layer_match:
            raise AdapterFormatError(f"cannot find the layer in intervention key {key!r}")
        layer = int(layer_match.group(1))
        index_match = _INDEX.search(key)
        index = int(index_match.group(1)) if index_match else 0
        shared = share_weights or positions == "prefill"
        if shared and index:
            raise AdapterFormatError(f"{key}: several interventions on layer {layer}; "
                                     "pass --separate-weights for first/last parts")
        part = "shared" if shared else ("first", "last")[index]
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 (weights_only refuses any non-tensor object)
            raise AdapterFormatError(
                f"refusing {path.name}: it holds more than plain tensors ({exc.__class__.__name__})"
            ) from None
        for suffix, tensor in convert_intervention(kind, dict(state)).items():
            tensors[f"layers.{layer}.{part}.{suffix}"] = tensor
            rank = max(rank, tensor.shape[0])
        layers.add(layer)
    config = {
        "peft_type": "REFT", "reft_type": kind, "rank": rank, "layers": sorted(layers),
        "positions": positions, "share_weights": share_weights or positions == "prefill",
        "base_model_name_or_path": base_model, MODE_KEY: "prefill",
    }
    dst.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dst / WEIGHTS_FILE))
    (dst / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
    return dst


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="pyreft save directory (intkey_*.bin files)")
    p.add_argument("dst", type=Path, help="output adapter directory")
    p.add_argument("--reft-type", choices=["direft", "loreft"], required=True)
    p.add_argument("--positions", required=True, help="as trained: f{n}+l{n}, f{n}, l{n}, prefill")
    p.add_argument("--base-model", required=True, help="base model name or path")
    p.add_argument("--separate-weights", action="store_true",
                   help="first/last positions were trained with separate interventions")
    args = p.parse_args(argv)
    out = convert(args.src, args.dst, args.reft_type, args.positions, args.base_model,
                  share_weights=not args.separate_weights)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
