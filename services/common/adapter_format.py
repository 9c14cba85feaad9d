"""The on-disk adapter format every component agrees on, and adapter identity.

An adapter is a directory (or blob pair) with ``adapter_config.json`` and
``adapter_model.safetensors``. Two extra config keys make it a preft-serve adapter:

* ``preft_mode``: ``"prefill"`` (PreFT: adapter on prompt tokens only) or ``"all"``
  (classic PEFT). A plain PEFT adapter without the key is ``"all"``.
* ReFT adapters have ``"peft_type": "REFT"`` and ``"reft_type": "direft" | "loreft"``
  (see docs/adapters.md and docs/reft.md); LoRA adapters are ordinary PEFT ``"peft_type": "LORA"`` configs.

Identity is content: ``sha256`` over the canonical config JSON and the weights bytes, so
names and versions are only labels, and the prefix cache can key on content.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MODE_KEY = "preft_mode"
REFT_TYPE_KEY = "reft_type"
_DIGEST_DOMAIN = b"preft-adapter-v1\0"


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
    """Adapter family from the config's ``peft_type`` (and ``reft_type`` for ReFT)."""
    peft_type = str(config.get("peft_type", "")).upper()
    if peft_type == "LORA":
        return AdapterType.LORA
    if peft_type == "REFT":
        raw = config.get(REFT_TYPE_KEY)
        if raw in (AdapterType.DIREFT.value, AdapterType.LOREFT.value):
            return AdapterType(raw)
        raise AdapterFormatError(f"{REFT_TYPE_KEY} must be 'direft' or 'loreft' (got {raw!r})")
    raise AdapterFormatError(
        f"peft_type must be 'LORA' or 'REFT' (got {config.get('peft_type')!r})"
    )


def canonical_config_bytes(config: Mapping[str, Any]) -> bytes:
    """Stable JSON encoding, so formatting differences never change identity."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def adapter_digest(config: Mapping[str, Any], weights: bytes) -> str:
    """Content hash (hex sha256) of an adapter: canonical config plus weight bytes."""
    h = hashlib.sha256(_DIGEST_DOMAIN)
    cfg = canonical_config_bytes(config)
    h.update(len(cfg).to_bytes(8, "little"))
    h.update(cfg)
    h.update(hashlib.sha256(weights).digest())
    return h.hexdigest()


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
    return adapter_digest(read_config(directory), (directory / WEIGHTS_FILE).read_bytes())
