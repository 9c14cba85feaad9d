"""``preft files ...``: upload fine-tuning data (validated by the registry), list, show,
download and delete files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from preft_serve.cli.client import CliError, Registry


def upload(reg: Registry, path: Path) -> Any:
    """POST /v1/files with purpose fine-tune; the registry names every bad line."""
    if not path.is_file():
        raise CliError(f"{path} is not a file")
    with open(path, "rb") as handle:
        return reg.call(
            "POST",
            "/v1/files",
            data={"purpose": "fine-tune"},
            files={"file": (path.name, handle, "application/jsonl")},
        )


def _table(result: dict[str, Any], args: argparse.Namespace) -> Any:
    if args.json:
        return result
    return {
        f["id"]: f"{f['purpose']:<18} {f['bytes']:>10} B  {f['filename']}" for f in result["data"]
    } or {"files": "none"}


def _download(reg: Registry, args: argparse.Namespace) -> Any:
    out = sys.stdout.buffer if args.out == "-" else open(args.out, "wb")  # noqa: SIM115
    try:
        reg.download(f"/v1/files/{args.file_id}/content", out)
    finally:
        if out is not sys.stdout.buffer:
            out.close()
    return {"downloaded": args.file_id, "to": args.out}


def add_parser(groups: Any, leaf: Any) -> None:
    files = groups.add_parser("files", help="fine-tuning data files")
    sub = files.add_subparsers(dest="action", required=True)
    up = leaf(
        sub,
        "upload",
        "Upload a JSONL file of chat examples (purpose fine-tune)",
        lambda r, a: upload(r, a.path),
    )
    up.add_argument("path", type=Path, help='one {"messages": [...]} per line')
    leaf(sub, "list", "List your files", lambda r, a: _table(r.call("GET", "/v1/files"), a))
    leaf(
        sub, "show", "Show one file", lambda r, a: r.call("GET", f"/v1/files/{a.file_id}")
    ).add_argument("file_id")
    down = leaf(
        sub, "download", "Download a file's content (result files: per-step metrics CSV)", _download
    )
    down.add_argument("file_id")
    down.add_argument("--out", default="-", help="where to write it (default: stdout)")
    leaf(
        sub, "delete", "Delete a file", lambda r, a: r.call("DELETE", f"/v1/files/{a.file_id}")
    ).add_argument("file_id")
