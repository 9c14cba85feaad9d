"""The ``preft`` CLI called in-process, as the tests drive it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from preft_serve.cli import main

CREDENTIAL_VARS = ("PREFT_CONFIG", "PREFT_REGISTRY_URL", "PREFT_API_KEY", "PREFT_ADMIN_TOKEN")


@pytest.fixture(autouse=True)
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own $XDG_CONFIG_HOME, and none of the caller's PREFT_* credentials, so no
    test reads or writes the developer's ~/.config/preft (autouse where it is imported)."""
    home = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    return home


def run_cli(capsys: Any, *argv: str) -> tuple[int, str, str]:
    """``preft ARGV...``: (exit code, stdout, stderr); argparse's SystemExit is a code."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
