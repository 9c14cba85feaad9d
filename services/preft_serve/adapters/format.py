"""The on-disk adapter format every component agrees on, and adapter identity.

An adapter is a directory (or blob pair) with ``adapter_config.json`` and
``adapter_model.safetensors``. Two extra config keys make it a preft-serve adapter:

* ``preft_mode``: ``"prefill"`` (PreFT: adapter on prompt tokens only) or ``"all"``
  (classic PEFT). A plain PEFT adapter without the key is ``"all"``.
* ReFT adapters have ``"peft_type": "REFT"`` and ``"reft_type": "direft" | "loreft"``
  (see docs/adapters.md and docs/reft.md); LoRA adapters are ordinary PEFT
  ``"peft_type": "LORA"`` configs.

Identity is content: ``sha256`` over the canonical config JSON and the weights bytes, so
names and versions are only labels, and the prefix cache can key on content. This module is
the one home of that contract:

* the digest: :func:`adapter_digest` (bytes in memory); :func:`weights_file_digest`,
  :func:`file_digest` and :func:`directory_digest` stream the weights from disk; all give
  the same value;
* its spelling, :func:`is_digest` (64 lowercase hex digits);
* the model name a worker loads an adapter by, ``sha256:<hex>``: :func:`format_model_name`,
  :func:`parse_model_name` and :data:`MODEL_NAME_PREFIX`.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MODE_KEY = "preft_mode"
REFT_TYPE_KEY = "reft_type"
_DIGEST_DOMAIN = b"preft-adapter-v1\0"
MODEL_NAME_PREFIX = "sha256:"
# fullmatch only: `$` would also accept a trailing newline.
_DIGEST = re.compile(r"[0-9a-f]{64}")


class AdapterMode(str, enum.Enum):
    """Which tokens an adapter is applied to."""

    PREFILL = "prefill"
    ALL = "all"


class AdapterType(str, enum.Enum):
    """Adapter families the engine can apply."""

    LORA = "lora"
    DIREFT = "direft"
    LOREFT = "loreft"


class AdapterFormatError(ValueError):
    """The adapter config is not one this service understands; the message says why."""


def adapter_mode(config: Mapping[str, Any]) -> AdapterMode:
    """Mode declared in the config; absent means classic all-token PEFT."""
    raw = config.get(MODE_KEY, AdapterMode.ALL.value)
    try:
        return AdapterMode(raw)
    except ValueError:
        valid = ", ".join(m.value for m in AdapterMode)
        raise AdapterFormatError(f"{MODE_KEY} must be one of: {valid} (got {raw!r})") from None


def adapter_type(config: Mapping[str, Any]) -> AdapterType:
    """Adapter type from the config's ``peft_type`` (and ``reft_type`` for ReFT), as the
    registered families (``preft_serve.adapters.families``) declare them."""
    from preft_serve.adapters.families import Runtime, families  # they import this module

    peft_type = str(config.get("peft_type", "")).upper()
    matching = [f for f in families() if f.peft_type == peft_type]
    if not matching:
        valid = " or ".join(sorted({f"'{f.peft_type}'" for f in families()}))
        raise AdapterFormatError(f"peft_type must be {valid} (got {config.get('peft_type')!r})")
    if matching[0].runtime is not Runtime.REFT:
        return matching[0].type
    raw = config.get(REFT_TYPE_KEY)
    for family in matching:
        if raw == family.type.value:
            return family.type
    valid = " or ".join(f"'{f.type.value}'" for f in matching)
    raise AdapterFormatError(f"{REFT_TYPE_KEY} must be {valid} (got {raw!r})")


def canonical_config_bytes(config: Mapping[str, Any]) -> bytes:
    """Stable JSON encoding, so formatting differences never change identity."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _digest(config: Mapping[str, Any], weights_sha256: bytes) -> str:
    h = hashlib.sha256(_DIGEST_DOMAIN)
    cfg = canonical_config_bytes(config)
    h.update(len(cfg).to_bytes(8, "little"))
    h.update(cfg)
    h.update(weights_sha256)
    return h.hexdigest()


def adapter_digest(config: Mapping[str, Any], weights: bytes) -> str:
    """Content hash (hex sha256) of an adapter: canonical config plus weight bytes."""
    return _digest(config, hashlib.sha256(weights).digest())


def weights_file_digest(config: Mapping[str, Any], weights_path: str | Path) -> str:
    """``adapter_digest`` of a config and a weights file, without reading the file into RAM."""
    with open(weights_path, "rb") as fh:
        weights_sha256 = hashlib.file_digest(fh, "sha256").digest()  # streamed in chunks
    return _digest(config, weights_sha256)


def file_digest(config_bytes: bytes, weights_path: str | Path) -> str:
    """``adapter_digest`` of config file bytes and a weights file (streamed)."""
    return weights_file_digest(json.loads(config_bytes), weights_path)


def is_digest(value: str) -> bool:
    """A lowercase hex sha256 (adapter content hashes, API key hashes)."""
    return _DIGEST.fullmatch(value) is not None


def format_model_name(sha256: str) -> str:
    """The model name a worker loads adapter ``sha256`` by: ``sha256:<hex>``."""
    if not is_digest(sha256):
        raise ValueError(f"not a lowercase hex sha256: {sha256!r}")
    return f"{MODEL_NAME_PREFIX}{sha256}"


def parse_model_name(name: object) -> str | None:
    """The hex digest of a ``sha256:<64 lowercase hex>`` model name, else None."""
    if not (isinstance(name, str) and name.startswith(MODEL_NAME_PREFIX)):
        return None
    sha256 = name[len(MODEL_NAME_PREFIX) :]
    return sha256 if is_digest(sha256) else None


def read_config(directory: str | Path) -> dict[str, Any]:
    """Parse ``adapter_config.json`` of an adapter directory."""
    path = Path(directory) / CONFIG_FILE
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise AdapterFormatError(f"{path} is missing") from None
    except json.JSONDecodeError as exc:
        raise AdapterFormatError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterFormatError(f"{path} must hold a JSON object")
    return config


def directory_digest(directory: str | Path) -> str:
    """Content hash of an adapter directory (same value the registry assigns)."""
    directory = Path(directory)
    return weights_file_digest(read_config(directory), directory / WEIGHTS_FILE)
