"""ReFT (``"peft_type": "REFT"``): one validator per ReFT family, per docs/adapters.md.

For each layer ``L`` in ``layers`` and each part ``P`` the tensors are
``layers.{L}.{P}.{suffix}`` for the suffixes of the type's family (``{w1,b,w2}`` for DiReFT,
``{r,w,b}`` for LoReFT; ``preft_serve.adapters.families``). ``P`` is ``shared`` when
``share_weights`` is true (the default when absent, as the worker reads it) or ``positions``
is ``prefill``; otherwise both ``first`` and ``last``, whatever the position string (the
worker loads both). Tensors the family names in ``orthonormal_rows`` (LoReFT's ``r``) must
have orthonormal rows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from preft_serve.adapters.families import Runtime, families, family_of
from preft_serve.adapters.format import AdapterFormatError
from preft_serve.adapters.reft_format import parse_positions, parts, tensor_name
from preft_serve.common.text import clip, shown
from preft_serve.registry.validation.base import (
    AdapterRejected,
    AdapterValidator,
    BaseModelSpec,
    Shapes,
    UploadBounds,
    is_int,
    register_validator,
    require,
)
from preft_serve.registry.validation.weights import WeightsFile

MAX_POSITIONS = 1024
# Orthonormality tolerance on max |R Rᵀ - I|, looser for half-precision storage.
_ORTHO_TOL = {"F32": 1e-3, "F64": 1e-3, "F16": 2e-2, "BF16": 5e-2}


class ReftValidator(AdapterValidator):
    """Rules shared by every ReFT family; a subclass per family sets ``type``."""

    def check_config(
        self, config: Mapping[str, Any], base: BaseModelSpec, bounds: UploadBounds
    ) -> int:
        rank = config.get("rank")
        if not (is_int(rank) and rank >= 1):
            raise AdapterRejected(
                f"ReFT config 'rank' must be a positive integer (got {shown(rank)})"
            )
        require(
            rank <= bounds.max_reft_rank,
            f"ReFT rank {rank} exceeds this registry's "
            f"maximum of {bounds.max_reft_rank}; retrain with rank <= {bounds.max_reft_rank}",
        )
        require(
            rank <= base.hidden_size,
            f"ReFT rank {rank} exceeds the base model's hidden_size {base.hidden_size}",
        )
        layers = config.get("layers")
        require(
            isinstance(layers, list)
            and bool(layers)
            and all(is_int(x) and 0 <= x < base.num_layers for x in layers)
            and len(set(layers)) == len(layers),
            f"ReFT config 'layers' must be a non-empty list of distinct layer indices in "
            f"0..{base.num_layers - 1} (the base model has {base.num_layers} layers; "
            f"got {shown(layers)})",
        )
        positions = config.get("positions")
        try:
            spec = parse_positions(positions)
        except AdapterFormatError as exc:
            raise AdapterRejected(clip(str(exc))) from None
        counts = [int(n) for n in re.findall(r"\d+", str(positions))] if spec is not None else []
        require(
            all(1 <= n <= MAX_POSITIONS for n in counts),
            f"ReFT position counts must be between 1 and {MAX_POSITIONS} (got {shown(positions)})",
        )
        require(
            isinstance(config.get("share_weights", True), bool),
            "ReFT config 'share_weights' must be true or false",
        )
        return rank

    def expected_tensors(self, config: Mapping[str, Any], base: BaseModelSpec) -> Shapes:
        rank, hidden = int(config["rank"]), base.hidden_size
        shapes: Shapes = {}
        for layer in config["layers"]:
            for part in parts(config):
                for suffix, kind in family_of(self.type).reft_tensors.items():
                    shapes[tensor_name(layer, part, suffix)] = (
                        (rank, hidden) if kind == "rd" else (rank,)
                    )
        return shapes

    def check_values(
        self, config: Mapping[str, Any], weights: WeightsFile, bounds: UploadBounds
    ) -> list[str]:
        family = family_of(self.type)
        suffixes = tuple(f".{suffix}" for suffix in family.orthonormal_rows)
        problems = []
        for name, info in weights.tensors.items():
            if not suffixes or not name.endswith(suffixes):
                continue
            r = weights.array(name).astype(np.float64)
            error = float(np.max(np.abs(r @ r.T - np.eye(r.shape[0]))))
            if error > _ORTHO_TOL.get(info.dtype, 1e-3):
                problems.append(
                    f"{family.label} tensor {name} must have orthonormal rows (max |R·Rᵀ − I| "
                    f"= {error:.3g}); orthonormalise it, e.g. with torch.linalg.qr(R.T).Q.T"
                )
        return problems


for _family in families(Runtime.REFT):
    register_validator(
        type(
            f"{_family.label}Validator",
            (ReftValidator,),
            {"type": _family.type, "__module__": __name__},
        )
    )
