"""Imported by :mod:`bench.gpu_kernels` before ``preft_kernels``: without CUDA it selects
Triton's interpreter (chosen when a kernel is decorated, so before the kernels' import),
and on a device machine with the repository but no install it maps ``kernels/`` to
``preft_kernels``."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _import_preft_kernels() -> None:
    try:
        import preft_kernels  # noqa: F401
    except ImportError:
        spec = importlib.util.spec_from_file_location(
            "preft_kernels",
            ROOT / "kernels" / "__init__.py",
            submodule_search_locations=[str(ROOT / "kernels")],
        )
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules["preft_kernels"] = module
        spec.loader.exec_module(module)


_import_preft_kernels()
