"""The adapter-type extension point: an abstract validator plus a named registry.

A validator turns one adapter type's config into the exact set of tensors (name -> shape)
the configured base model implies; the shared driver in ``validation/__init__.py`` compares
that with the uploaded file and runs the type-independent checks (safetensors, dtype,
finite values, size). Adding a type is one module that subclasses
:class:`AdapterValidator` and decorates it with :func:`register_validator`.
"""

from __future__ import annotations

import abc
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeGuard, TypeVar

from preft_serve.adapters.format import AdapterType
from preft_serve.common.domain_errors import InvalidContent
from preft_serve.common.rank_caps import RANK_CAPS
from preft_serve.registry.validation.weights import WeightsFile


class AdapterRejected(InvalidContent):
    """The adapter failed validation; the message (and details) say what to fix."""

    code = "invalid_adapter"


@dataclasses.dataclass(frozen=True)
class UploadBounds:
    """Configured bounds every upload must respect."""

    max_lora_rank: int = RANK_CAPS.max_lora_rank  # what the workers serve
    max_reft_rank: int = RANK_CAPS.max_reft_rank
    allowed_dtypes: tuple[str, ...] = ("F32", "F16", "BF16")
    max_weights_bytes: int = 1 << 30
    max_config_bytes: int = 1 << 20
    max_archive_members: int = 16
    max_compression_ratio: float = 100.0
    max_json_depth: int = 32  # adapter_config.json nesting (PEFT configs use 3)
    # Magnitudes past which an adapter only produces inf/NaN. Random test adapters (std 0.3,
    # rank 64, lora_alpha 2r) reach ~1.5 per weight and ~200 per update element.
    max_abs_weight: float = 1e4  # any adapter tensor element
    max_lora_scale: float = 256.0  # lora_alpha / r (or / sqrt(r) with use_rslora)
    max_lora_update: float = 1e4  # scale x r x max|lora_A| x max|lora_B|


@dataclasses.dataclass(frozen=True)
class BaseModelSpec:
    """The shapes of the served base model that adapters must match."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    architecture: str = ""  # config.json "architectures"[0], for messages
    # Other names the base model goes by (its directory, config.json's _name_or_path):
    # an adapter whose base_model_name_or_path is none of these nor `name` gets a warning.
    aliases: tuple[str, ...] = ()

    @classmethod
    def from_config(
        cls, name: str, config: Mapping[str, Any], aliases: tuple[str, ...] = ()
    ) -> BaseModelSpec:
        archs = config.get("architectures")
        arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
        own_name = config.get("_name_or_path")
        if isinstance(own_name, str) and own_name:
            aliases += (own_name,)
        config = config.get("text_config") or config  # multimodal wrappers nest the LM
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            return cls(
                name=name,
                num_layers=int(config["num_hidden_layers"]),
                hidden_size=hidden,
                num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                intermediate_size=int(config["intermediate_size"]),
                architecture=arch,
                aliases=aliases,
            )
        except KeyError as exc:
            raise ValueError(f"base model config.json lacks {exc.args[0]!r}") from None

    @classmethod
    def load(cls, name: str, config_json: Path) -> BaseModelSpec:
        config_json = Path(config_json)
        return cls.from_config(
            name,
            json.loads(config_json.read_text()),
            aliases=tuple(
                dict.fromkeys((config_json.parent.name, config_json.resolve().parent.name))
            ),
        )

    def is_named(self, name: str) -> bool:
        """Whether ``name`` (an adapter's base_model_name_or_path) means this model: its
        label, directory or hub id, compared by last path component, case-insensitively."""

        def key(text: str) -> str:
            return text.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lower()

        return key(name) in {key(n) for n in (self.name, *self.aliases) if n}

    def describe(self) -> str:
        return (
            f"{self.name} (layers={self.num_layers}, hidden_size={self.hidden_size}, "
            f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"intermediate_size={self.intermediate_size})"
        )


Shapes = dict[str, tuple[int, ...]]


class AdapterValidator(abc.ABC):
    """Validation rules of one adapter type."""

    type: ClassVar[AdapterType]

    @abc.abstractmethod
    def check_config(
        self, config: Mapping[str, Any], base: BaseModelSpec, bounds: UploadBounds
    ) -> int:
        """Raise :class:`AdapterRejected` for a bad config; return the adapter's rank."""

    @abc.abstractmethod
    def expected_tensors(self, config: Mapping[str, Any], base: BaseModelSpec) -> Shapes:
        """Exactly the tensors (name -> shape) this config needs on this base model."""

    def check_values(
        self, config: Mapping[str, Any], weights: WeightsFile, bounds: UploadBounds
    ) -> list[str]:
        """Type-specific checks on tensor values; returns problems (none by default)."""
        return []

    def config_warnings(self, config: Mapping[str, Any], base: BaseModelSpec) -> list[str]:
        """Accepted but doubtful config settings (errors in strict mode); none by default."""
        return []


_V = TypeVar("_V", bound=type[AdapterValidator])
_VALIDATORS: dict[AdapterType, AdapterValidator] = {}


def register_validator(cls: _V) -> _V:
    """Class decorator: make ``cls`` the validator for ``cls.type``."""
    _VALIDATORS[cls.type] = cls()
    return cls


def get_validator(adapter_type: AdapterType) -> AdapterValidator:
    """Validator for a type; an unknown one raises with the list of supported types."""
    try:
        return _VALIDATORS[adapter_type]
    except KeyError:
        valid = ", ".join(sorted(t.value for t in _VALIDATORS))
        raise AdapterRejected(
            f"adapter type {adapter_type.value!r} is not supported here; supported: {valid}"
        ) from None


def supported_types() -> list[AdapterType]:
    return sorted(_VALIDATORS, key=lambda t: t.value)


def require(condition: bool, message: str) -> None:
    """Reject with ``message`` unless ``condition`` holds."""
    if not condition:
        raise AdapterRejected(message)


def is_int(value: object) -> TypeGuard[int]:
    """A JSON integer (``true`` is not 1 here)."""
    return isinstance(value, int) and not isinstance(value, bool)
