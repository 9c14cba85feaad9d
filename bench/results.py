"""Where benchmarks write their results, and where the recorded ones live.

A run writes into ``--result-dir`` (default :data:`DEFAULT_DIR`, ``var/results/`` at the
repository root, ignored by git), so running a benchmark leaves the source tree as it was.
The results the docs show (the JSON whose numbers they quote, the plots they name) are
copied by hand into :data:`RECORDED`, ``docs/results/``, next to the docs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / "var" / "results"
RECORDED = ROOT / "docs" / "results"


def add_result_dir(parser: argparse.ArgumentParser) -> None:
    """The ``--result-dir`` option every benchmark takes (its ``--out``, where it has one,
    names one file or prefix and wins over it)."""
    parser.add_argument(
        "--result-dir",
        type=Path,
        default=DEFAULT_DIR,
        help=f"folder for the results under their default names "
        f"(default {DEFAULT_DIR.relative_to(ROOT)}/, outside the source "
        f"tree; the docs' recorded results are in docs/results/)",
    )


def result_path(result_dir: Path, name: str) -> Path:
    """``result_dir / name``, with ``result_dir`` created."""
    result_dir.mkdir(parents=True, exist_ok=True)
    return result_dir / name
