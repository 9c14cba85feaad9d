"""The real instruct model (SmolLM2-135M-Instruct), prepared once per machine.

``preft model prepare`` keeps it in ``var/models`` of the checkout (override with
``PREFT_TEST_MODELS_DIR``), so only the first test session on a machine pays the download
and conversion (~1 minute).
"""

from __future__ import annotations

import os
from pathlib import Path

from preft_serve.basemodels import DEFAULT_MODEL, prepare_model

REPO = Path(__file__).resolve().parents[2]


def real_model_dir(name: str = DEFAULT_MODEL) -> Path:
    root = Path(os.environ.get("PREFT_TEST_MODELS_DIR", REPO / "var" / "models"))
    return prepare_model(name, root / name, say=lambda _: None)
