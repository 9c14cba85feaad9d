"""Adapter identity: one digest however it is computed, and the ``sha256:<hex>`` model name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from preft_serve.adapters.format import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    adapter_digest,
    directory_digest,
    file_digest,
    format_model_name,
    is_digest,
    parse_model_name,
    weights_file_digest,
)

SHA = "0123456789abcdef" * 4
CONFIG = {"peft_type": "LORA", "r": 2, "preft_mode": "prefill"}


@pytest.mark.parametrize("weights", [b"", b"\x01" * 10, bytes(range(256)) * 5000])
def test_streamed_digests_equal_the_in_memory_one(tmp_path: Path, weights: bytes) -> None:
    (tmp_path / CONFIG_FILE).write_text(json.dumps(CONFIG, indent=2))
    (tmp_path / WEIGHTS_FILE).write_bytes(weights)
    expected = adapter_digest(CONFIG, weights)
    assert weights_file_digest(CONFIG, tmp_path / WEIGHTS_FILE) == expected
    assert file_digest((tmp_path / CONFIG_FILE).read_bytes(), tmp_path / WEIGHTS_FILE) == expected
    assert directory_digest(tmp_path) == expected


def test_digest_value_is_pinned() -> None:
    """The registry stores these values: the formula must never change."""
    assert adapter_digest({"a": 1}, b"w") == (
        "0de055b46ba0873b8e4818ed149b28d09e621bfba69f41747d233250ad32da70"
    )


def test_model_name_round_trip() -> None:
    assert format_model_name(SHA) == f"sha256:{SHA}"
    assert parse_model_name(format_model_name(SHA)) == SHA
    assert is_digest(SHA) and not is_digest(SHA + "\n") and not is_digest(SHA.upper())


@pytest.mark.parametrize(
    "name", [SHA, f"sha256:{SHA.upper()}", f"sha256:{SHA}\n", "sha256:", f"SHA256:{SHA}", None, 42]
)
def test_parse_model_name_refuses_anything_else(name: object) -> None:
    assert parse_model_name(name) is None


def test_format_model_name_refuses_a_non_digest() -> None:
    with pytest.raises(ValueError, match="not a lowercase hex sha256"):
        format_model_name("abc")
