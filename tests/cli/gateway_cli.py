"""Helpers for running ``preft`` against the real registry and gateway of the forwarding
tests (``tests/gateway/test_tenant_forwarding.py``): log in to the gateway alone, read the
CLI's JSON, and read the registry's own answer as the reference."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.fuzz.support import lora_files
from tests.gateway.test_tenant_forwarding import Stack
from tests.support.cli import run_cli


def login(s: Stack, key: str, capsys: Any, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """``preft login`` to the gateway's URL as context ``name``, the key on stdin."""
    monkeypatch.setattr("sys.stdin", io.StringIO(key + "\n"))
    code, out, err = run_cli(capsys, "login", "--url", s.gateway, "--context", name)
    assert code == 0, err
    assert f"logged in to {s.gateway} as context {name!r}" in out


def cli_json(capsys: Any, *argv: str) -> Any:
    code, out, err = run_cli(capsys, "--json", *argv)
    assert code == 0, err
    return json.loads(out)


def registry_answer(s: Stack, key: str, path: str, **params: Any) -> Any:
    """The registry's own answer, read without the CLI or the gateway: the reference."""
    got = s.registry.call(key, "GET", path, params=params)
    assert got.status_code == 200, got.text
    return got.json()


def adapter_dir(root: Path, seed: int) -> Path:
    folder = root / f"adapter-{seed}"
    folder.mkdir()
    config, weights = lora_files(seed)
    (folder / "adapter_config.json").write_bytes(config)
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder
