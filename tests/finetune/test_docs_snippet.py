"""The fine-tuning session in docs/fine-tuning.md type-checks against the ``openai``
SDK's own types: a reader who copies it into a typed project gets no mypy errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs" / "fine-tuning.md"
CACHE = ROOT / ".mypy_cache" / "docs-snippet"  # its own: the SDK's types, checked once


def documented_job_snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    return next(b for b in blocks if "fine_tuning.jobs.create(" in b)


def test_the_documented_job_snippet_type_checks_with_the_sdk(tmp_path: Path) -> None:
    snippet = documented_job_snippet()
    assert 'extra_body={"preft"' in snippet and '"type": "supervised"' in snippet
    (tmp_path / "snippet.py").write_text(snippet)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--cache-dir",
            str(CACHE),
            "--config-file",
            "/dev/null",
            "--follow-imports",
            "silent",
            "--python-version",
            "3.11",
            "snippet.py",
        ],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
