"""Adapter validation: nothing is stored unless every check here passes.

:func:`validate_adapter` runs the shared checks (config JSON, type, safetensors structure,
dtypes, exact tensor names and shapes for the base model, finite values) and the
type-specific rules of the validator registered for the adapter's type (``lora``,
``reft``; see ``validation/base.py`` for adding one).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NoReturn

from preft_serve.adapters.format import (
    MODE_KEY,
    AdapterFormatError,
    AdapterMode,
    AdapterType,
    adapter_type,
    canonical_config_bytes,
    file_digest,
)
from preft_serve.common.text import clip, shown
from preft_serve.registry.validation import lora, reft  # noqa: F401  (register validators)
from preft_serve.registry.validation.base import (
    AdapterRejected,
    AdapterValidator,
    BaseModelSpec,
    UploadBounds,
    get_validator,
    register_validator,
    supported_types,
)
from preft_serve.registry.validation.configjson import load_config
from preft_serve.registry.validation.weights import WeightsFile, WeightsFormatError

__all__ = [
    "AdapterRejected",
    "AdapterValidator",
    "BaseModelSpec",
    "UploadBounds",
    "ValidatedAdapter",
    "get_validator",
    "load_config",
    "register_validator",
    "supported_types",
    "validate_adapter",
]
_MAX_LISTED = 20


@dataclasses.dataclass(frozen=True)
class ValidatedAdapter:
    """A checked adapter: canonical config bytes plus the facts the registry records."""

    config: dict[str, Any]
    config_bytes: bytes
    weights_path: Path
    type: AdapterType
    mode: AdapterMode
    rank: int
    sha256: str
    size_bytes: int
    base_model: str
    warnings: tuple[str, ...] = ()  # accepted, but the tenant should look (strict: refused)


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _tensor_problems(
    validator: AdapterValidator,
    config: dict[str, Any],
    weights: WeightsFile,
    base: BaseModelSpec,
    bounds: UploadBounds,
) -> list[str]:
    expected = validator.expected_tensors(config, base)
    actual = weights.tensors
    problems: list[str] = []
    for name, info in actual.items():
        shown_name = clip(name, 200)  # names come from the uploaded file's header
        if name not in expected:
            problems.append(
                f"unexpected tensor {shown_name}: adapter_config.json "
                f"({validator.type.value}) does not call for it"
            )
        elif info.shape != expected[name]:
            problems.append(
                f"tensor {shown_name} has shape {clip(_shape(info.shape), 100)}; base model "
                f"{base.describe()} "
                f"needs {_shape(expected[name])} - was it trained for another base model?"
            )
        if info.dtype not in bounds.allowed_dtypes:
            problems.append(
                f"tensor {shown_name} has dtype {clip(info.dtype, 20)}; use one of "
                f"{', '.join(bounds.allowed_dtypes)}"
            )
    for name, shape in expected.items():
        if name not in actual:
            problems.append(
                f"missing tensor {name} (shape {_shape(shape)}) that adapter_config.json calls for"
            )
    if not problems:
        problems = [
            f"tensor {name} contains NaN or Inf values; fix the training run"
            for name in actual
            if weights.has_non_finite(name)
        ]
    if not problems:
        problems = [
            f"tensor {name} has values up to {weights.max_abs(name):.3g} in magnitude; the "
            f"limit is {bounds.max_abs_weight:.3g} - such an adapter only produces inf/NaN, "
            "check the training run"
            for name in actual
            if weights.max_abs(name) > bounds.max_abs_weight
        ]
    return problems


def _base_model_warnings(config: dict[str, Any], base: BaseModelSpec) -> list[str]:
    named = config.get("base_model_name_or_path")
    if not isinstance(named, str) or not named or base.is_named(named):
        return []
    arch = f", {base.architecture}" if base.architecture else ""
    return [
        (
            f"adapter_config.json names base_model_name_or_path {shown(named)}, but this "
            f"registry serves {base.name!r}{arch}; the shapes match, so the adapter was "
            "accepted, but one trained on another model gives wrong outputs here - check it, "
            "or upload with strict=true to refuse such adapters"
        )
    ]


def validate_adapter(
    config_path: Path,
    weights_path: Path,
    mode: AdapterMode,
    base: BaseModelSpec,
    bounds: UploadBounds,
    *,
    strict: bool = False,
) -> ValidatedAdapter:
    """Check an unpacked adapter; raise :class:`AdapterRejected` with every problem found.

    The stored config is the uploaded one with ``preft_mode`` set from ``mode``. Doubtful
    but servable settings (another ``base_model_name_or_path``, ``target_modules`` entries
    that match nothing) come back as ``warnings``; ``strict`` refuses them instead.
    """
    config = load_config(config_path, bounds)
    config[MODE_KEY] = AdapterMode(mode).value
    try:
        kind = adapter_type(config)
    except AdapterFormatError as exc:
        raise AdapterRejected(f"adapter_config.json: {clip(str(exc))}") from None
    validator = get_validator(kind)
    rank = validator.check_config(config, base, bounds)
    size = weights_path.stat().st_size
    if size > bounds.max_weights_bytes:
        raise AdapterRejected(
            f"adapter_model.safetensors is {size} bytes; the limit is {bounds.max_weights_bytes}"
        )
    try:
        weights = WeightsFile(weights_path)
    except WeightsFormatError as exc:
        raise AdapterRejected(str(exc)) from None
    problems = _tensor_problems(validator, config, weights, base, bounds)
    if not problems:
        problems = validator.check_values(config, weights, bounds)
    if problems:
        _reject(problems)
    warnings = validator.config_warnings(config, base) + _base_model_warnings(config, base)
    if strict and warnings:
        _reject([f"strict mode: {w}" for w in warnings])
    config_bytes = canonical_config_bytes(config)
    return ValidatedAdapter(
        config=config,
        config_bytes=config_bytes,
        weights_path=weights_path,
        type=kind,
        mode=AdapterMode(mode),
        rank=rank,
        sha256=file_digest(config_bytes, weights_path),
        size_bytes=size + len(config_bytes),  # what the store keeps, and the quota counts
        base_model=base.name,
        warnings=tuple(warnings),
    )


def _reject(problems: list[str]) -> NoReturn:
    extra = f" (and {len(problems) - 1} more; see details)" if len(problems) > 1 else ""
    raise AdapterRejected(
        problems[0] + extra, details=[{"message": p} for p in problems[:_MAX_LISTED]]
    )
