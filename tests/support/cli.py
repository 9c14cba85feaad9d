"""The ``preft`` CLI called in-process, as the tests drive it."""

from __future__ import annotations

from typing import Any

from preft_serve.cli import main


def run_cli(capsys: Any, *argv: str) -> tuple[int, str, str]:
    """``preft ARGV...``: (exit code, stdout, stderr); argparse's SystemExit is a code."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
