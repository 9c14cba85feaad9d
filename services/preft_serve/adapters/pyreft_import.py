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
* pyreft's own ``config.json`` (pyvene's ``IntervenableConfig``) says which intervention
  class each key holds and which module output it edits: the ReFT type is read from it
  (``--reft-type`` must agree when given), and anything this format cannot represent
  (another intervention class, an edit of ``mlp_output``, an attention head...) is refused
  rather than converted into different math.

Usage: ``python -m preft_serve.adapters.pyreft_import PYREFT_DIR OUT_DIR --positions f7+l7
--base-model NAME [--reft-type loreft]``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

from preft_serve.adapters.format import (
    CONFIG_FILE,
    MODE_KEY,
    WEIGHTS_FILE,
    AdapterFormatError,
)

_LAYER = re.compile(r"layer[._](\d+)")
_INDEX = re.compile(r"#(\d+)$")
_COMPONENT = re.compile(r"comp\.([A-Za-z0-9_.]+?)\.unit\b|comp\.([A-Za-z0-9_]+)")
_CLASS = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)'?>?\s*$")

PYREFT_CONFIG = "config.json"
MAX_CONFIG_BYTES = 1 << 20
RESIDUAL_STREAM = "block_output"
"""The only module output our ReFT runtime edits: each decoder layer's output."""
PYREFT_CLASSES = {"LoreftIntervention": "loreft", "DireftIntervention": "direft"}
"""pyreft intervention classes whose math our LoReFT / DiReFT reproduce exactly."""


def _component(key: str) -> str | None:
    match = _COMPONENT.search(key)
    return (match.group(1) or match.group(2)) if match else None


def read_pyreft_config(src: Path) -> dict[str, str] | None:
    """Intervention key -> our ReFT type, from pyreft's ``config.json`` (None without one).

    Refuses what the conversion would silently get wrong: an intervention class other than
    pyreft's LoReFT/DiReFT, or an intervention on anything but the residual stream."""
    path = src / PYREFT_CONFIG
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise AdapterFormatError(
            f"{PYREFT_CONFIG} is over {MAX_CONFIG_BYTES} bytes: not a pyreft config"
        )
    try:
        config = json.loads(path.read_text())
        keys, types = config["sorted_keys"], config["intervention_types"]
    except (ValueError, KeyError, TypeError):
        raise AdapterFormatError(
            f"{PYREFT_CONFIG} is not pyreft's (pyvene IntervenableConfig "
            "with sorted_keys and intervention_types)"
        ) from None
    if not (isinstance(keys, list) and isinstance(types, list) and len(keys) == len(types)):
        raise AdapterFormatError(
            f"{PYREFT_CONFIG}: sorted_keys and intervention_types must be lists of the same length"
        )
    kinds: dict[str, str] = {}
    for key, type_name in zip(keys, types, strict=True):
        match = _CLASS.search(str(type_name)[:200])
        cls = match.group(1) if match else str(type_name)[:80]
        if cls not in PYREFT_CLASSES:
            raise AdapterFormatError(
                f"intervention {str(key)[:120]!r} is a {cls}; only pyreft's "
                f"{' and '.join(PYREFT_CLASSES)} convert to preft-serve's ReFT"
            )
        component = _component(str(key))
        if component is not None and component != RESIDUAL_STREAM:
            raise AdapterFormatError(
                f"intervention {str(key)[:120]!r} edits {component}; preft-serve applies "
                f"ReFT to each layer's output ({RESIDUAL_STREAM}) only: retrain with "
                f"component='{RESIDUAL_STREAM}'"
            )
        kinds[str(key)] = PYREFT_CLASSES[cls]
    for rep in config.get("representations") or []:
        component = (
            rep.get("component")
            if isinstance(rep, dict)
            else (rep[1] if isinstance(rep, list) and len(rep) > 1 else None)
        )
        if isinstance(component, str) and component != RESIDUAL_STREAM:
            raise AdapterFormatError(
                f"a representation edits {component[:60]}; preft-serve applies ReFT to each "
                f"layer's output ({RESIDUAL_STREAM}) only"
            )
    return kinds


def resolve_kind(src: Path, requested: str | None) -> str:
    """The ReFT type to convert as: pyreft's config decides; ``requested`` must agree."""
    kinds = read_pyreft_config(src)
    if kinds is None:
        if requested is None:
            raise AdapterFormatError(
                f"no {PYREFT_CONFIG} in {src}: pass --reft-type (direft or loreft) as trained"
            )
        return requested
    found = set(kinds.values())
    if len(found) != 1:
        raise AdapterFormatError(
            f"{PYREFT_CONFIG} mixes intervention types "
            f"({', '.join(sorted(found))}); one adapter has one type"
        )
    kind = found.pop()
    if requested is not None and requested != kind:
        raise AdapterFormatError(
            f"--reft-type {requested} does not match the checkpoint: "
            f"pyreft's {PYREFT_CONFIG} says {kind}"
        )
    return kind


def _rotation_from_parametrization(state: dict[str, torch.Tensor]) -> torch.Tensor:
    """Rebuild pyreft's ``orthogonal(LowRankRotateLayer)`` and read its weight (d × r)."""
    original = state["rotate_layer.parametrizations.weight.original"]
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.empty_like(original))
    layer = torch.nn.utils.parametrizations.orthogonal(layer)
    sub = {
        k.removeprefix("rotate_layer."): v
        for k, v in state.items()
        if k.startswith("rotate_layer.")
    }
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


def convert(
    src: Path, dst: Path, kind: str | None, positions: str, base_model: str, share_weights: bool
) -> Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` for a pyreft directory
    (``kind``: None reads it from pyreft's config)."""
    from safetensors.torch import save_file

    files = sorted(src.glob("intkey_*.bin"))
    if not files:
        raise AdapterFormatError(f"no intkey_*.bin files in {src}: is it a pyreft save dir?")
    kind = resolve_kind(src, kind)
    for path in files:
        component = _component(path.stem)
        if component is not None and component != RESIDUAL_STREAM:
            raise AdapterFormatError(
                f"{path.name} edits {component}; preft-serve applies ReFT to each layer's "
                f"output ({RESIDUAL_STREAM}) only: retrain with component='{RESIDUAL_STREAM}'"
            )
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
            raise AdapterFormatError(
                f"{key}: several interventions on layer {layer}; "
                "pass --separate-weights for first/last parts"
            )
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
        "peft_type": "REFT",
        "reft_type": kind,
        "rank": rank,
        "layers": sorted(layers),
        "positions": positions,
        "share_weights": share_weights or positions == "prefill",
        "base_model_name_or_path": base_model,
        MODE_KEY: "prefill",
    }
    dst.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dst / WEIGHTS_FILE))
    (dst / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
    return dst


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="pyreft save directory (intkey_*.bin files)")
    p.add_argument("dst", type=Path, help="output adapter directory")
    p.add_argument(
        "--reft-type",
        choices=["direft", "loreft"],
        help="as trained; read from pyreft's config.json when present (and then "
        "checked against it)",
    )
    p.add_argument("--positions", required=True, help="as trained: f{n}+l{n}, f{n}, l{n}, prefill")
    p.add_argument("--base-model", required=True, help="base model name or path")
    p.add_argument(
        "--separate-weights",
        action="store_true",
        help="first/last positions were trained with separate interventions",
    )
    args = p.parse_args(argv)
    try:
        out = convert(
            args.src,
            args.dst,
            args.reft_type,
            args.positions,
            args.base_model,
            share_weights=not args.separate_weights,
        )
    except AdapterFormatError as exc:
        p.error(str(exc))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
