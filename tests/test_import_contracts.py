"""The import contracts in pyproject.toml ([tool.importlinter]) catch what they forbid.

`make lint` checks the tree against them; these tests plant one forbidden import per
contract in a copy of the package and expect lint-imports to name it. A contract whose
modules were renamed or moved would otherwise keep everything and pass unnoticed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

# contract id -> (a new module in the copy, what it imports, the import as reported)
PLANTED = {
    "gateway": (
        "gateway/planted.py",
        "import preft_serve.worker.settings\n",
        "preft_serve.gateway.planted -> preft_serve.worker.settings",
    ),
    "common": (
        "common/planted.py",
        "import preft_serve.registry.names\n",
        "preft_serve.common.planted -> preft_serve.registry.names",
    ),
    # torch only through the trainer: the contract follows imports transitively.
    "no-torch": (
        "registry/planted.py",
        "from preft_serve.training import trainer\n",
        "preft_serve.registry.planted -> preft_serve.training.trainer",
    ),
    "vllm-seam": (
        "worker/planted.py",
        "from preft_serve.worker.vllm_compat import serving\n",
        "preft_serve.worker.planted -> preft_serve.worker.vllm_compat.serving",
    ),
    # Any vLLM import, also one through vllm_compat (the contract follows imports).
    "worker-domain": (
        "worker/adapter_tiers/planted.py",
        "import vllm.lora.request\n",
        "preft_serve.worker.adapter_tiers.planted -> vllm",
    ),
}


@pytest.mark.parametrize("contract", sorted(PLANTED))
def test_contract_breaks_on_a_planted_import(tmp_path: Path, contract: str) -> None:
    module, source, reported = PLANTED[contract]
    package = tmp_path / "services" / "preft_serve"
    shutil.copytree(
        ROOT / "services" / "preft_serve", package, ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (package / module).write_text(source)

    run = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", "--contract", contract, "pyproject.toml"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "services")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 broken" in run.stdout, run.stdout
    # Long lines are wrapped in the report: compare with the whitespace taken out.
    assert "".join(reported.split()) in "".join(run.stdout.split()), run.stdout
