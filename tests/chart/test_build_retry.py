"""The image build runs a step again only when the host's container runtime failed it: a
Dockerfile error fails at once, a runtime's transient EBUSY is retried a bounded number of
times. The builds here are a shell script that counts its runs and prints what a real
builder would."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.chart.support import ROOT

RUNTIME_ERROR = "Close_Fd sealing memfd copy: Device or resource busy"


@pytest.fixture(scope="module")
def build_images() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_images", ROOT / "scripts/build_images.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_images"] = module
    spec.loader.exec_module(module)
    return module


def builder(tmp_path: Path, outputs: list[tuple[int, str]]) -> tuple[list[str], Path]:
    """A command that, on its n-th run, prints ``outputs[n][1]`` and exits ``outputs[n][0]``."""
    runs = tmp_path / "runs"
    runs.write_text("0")
    cases = "\n".join(
        f'  {n}) echo "STEP 10/10: RUN pip install ."; echo "{text}"; exit {code};;'
        for n, (code, text) in enumerate(outputs)
    )
    script = tmp_path / "build.sh"
    script.write_text(
        f"n=$(cat {runs}); echo $((n + 1)) > {runs}\ncase $n in\n{cases}\n  *) exit 99;;\nesac\n"
    )
    return ["sh", str(script)], runs


def test_a_runtime_failure_is_built_again(
    build_images: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, runs = builder(tmp_path, [(1, RUNTIME_ERROR), (0, "Successfully tagged x")])
    build_images.build_with_retry(argv)
    assert runs.read_text().strip() == "2"
    out = capsys.readouterr().out
    assert RUNTIME_ERROR in out and "Successfully tagged x" in out  # the build's log is shown
    assert "attempt 2" in out


def test_a_dockerfile_error_fails_at_once(build_images: ModuleType, tmp_path: Path) -> None:
    argv, runs = builder(tmp_path, [(1, "pip: No matching distribution"), (0, "never")])
    with pytest.raises(subprocess.CalledProcessError) as failed:
        build_images.build_with_retry(argv)
    assert failed.value.returncode == 1
    assert runs.read_text().strip() == "1"


def test_a_runtime_that_keeps_failing_gives_up(build_images: ModuleType, tmp_path: Path) -> None:
    attempts = build_images.BUILD_ATTEMPTS
    argv, runs = builder(tmp_path, [(1, RUNTIME_ERROR)] * (attempts + 1))
    with pytest.raises(subprocess.CalledProcessError):
        build_images.build_with_retry(argv)
    assert runs.read_text().strip() == str(attempts)
