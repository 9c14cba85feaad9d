"""``preft files ...``: upload fine-tuning data (validated by the registry), list, show,
download and delete files."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from preft_serve.cli.client import CliError, Registry
from preft_serve.cli.ids import file_id
from preft_serve.cli.output import QUIET


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
    """To stdout: the content alone (nothing printed after it). To a file: written beside
    it first and moved into place once whole, so a refusal leaves an existing file as it
    was."""
    path = f"/v1/files/{args.file_id}/content"
    if args.out == "-":
        reg.download(path, sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return QUIET
    target = Path(args.out)
    with tempfile.NamedTemporaryFile(
        dir=target.parent, prefix=f".{target.name}.", delete=False
    ) as handle:
        partial = Path(handle.name)
        try:
            reg.download(path, handle)
        except BaseException:
            handle.close()
            partial.unlink(missing_ok=True)
            raise
    os.replace(partial, target)
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
    ).add_argument("file_id", type=file_id)
    down = leaf(
        sub, "download", "Download a file's content (result files: per-step metrics CSV)", _download
    )
    down.add_argument("file_id", type=file_id)
    down.add_argument("--out", default="-", help="where to write it (default: stdout)")
    leaf(
        sub, "delete", "Delete a file", lambda r, a: r.call("DELETE", f"/v1/files/{a.file_id}")
    ).add_argument("file_id", type=file_id)
