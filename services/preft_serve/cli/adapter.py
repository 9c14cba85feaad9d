"""``preft adapter ...``: upload, convert, list, show, download, rollback, delete, and the
serving policy (policy, promote, canary) and the evaluation gate (evaluation, evaluate)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE, AdapterMode, file_digest
from preft_serve.cli.client import CliError, ProgressFile, Registry, add_paging_options, list_pages
from preft_serve.cli.evaluation import add_evaluation_parsers
from preft_serve.cli.helptext import with_examples
from preft_serve.cli.ids import adapter_name
from preft_serve.cli.output import progress_bar, show_progress
from preft_serve.cli.policy import add_policy_parsers

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
PROGRESS_MIN_BYTES = 1 << 20  # on a terminal, smaller transfers finish before a bar helps


def _upload_parts(path: Path) -> list[Path]:
    if path.is_file():
        if not path.name.lower().endswith(ARCHIVE_SUFFIXES):
            raise CliError(
                f"{path} is a file but not an archive; pass the adapter folder or a "
                f"{'/'.join(ARCHIVE_SUFFIXES)} archive of it"
            )
        return [path]
    if not path.is_dir():
        raise CliError(f"{path} does not exist")
    missing = [n for n in (CONFIG_FILE, WEIGHTS_FILE) if not (path / n).is_file()]
    if missing:
        pickles = sorted(p.name for p in path.glob("*") if p.suffix in (".bin", ".pt", ".pth"))
        hint = (
            (
                f"; found {', '.join(pickles)}: convert it to safetensors with "
                f"`preft adapter convert {path}`"
            )
            if pickles
            else ""
        )
        raise CliError(f"{path} lacks {' and '.join(missing)}{hint}")
    return [path / CONFIG_FILE, path / WEIGHTS_FILE]


def _progress_wanted(args: argparse.Namespace, total: int) -> bool:
    return show_progress(args.progress, args.quiet) and (
        args.progress or total >= PROGRESS_MIN_BYTES
    )


def cmd_upload(reg: Registry, args: argparse.Namespace) -> Any:
    parts = _upload_parts(Path(args.path))
    if not args.new_version and not args.mode:
        raise CliError("--mode is required for a new adapter (prefill or all)")
    total = sum(p.stat().st_size for p in parts)
    bar = progress_bar(total, f"uploading {args.name}", _progress_wanted(args, total))
    handles = [ProgressFile(p, bar) for p in parts]
    try:
        files = [("files", (p.name, h, "application/octet-stream")) for p, h in zip(parts, handles)]
        data = {"mode": args.mode} if args.mode else {}
        params = {
            **({"strict": "true"} if args.strict else {}),
            **({"promote": "true"} if args.promote else {}),
        } or None
        if args.new_version:
            result = reg.call(
                "PUT", f"/v1/adapters/{args.name}", data=data, files=files, params=params
            )
        else:
            result = reg.call(
                "POST", "/v1/adapters", data={**data, "name": args.name}, files=files, params=params
            )
    finally:
        for h in handles:
            h.close()
        if bar is not None:
            bar.close()
    for warning in result.get("warnings") or ():
        sys.stderr.write(f"warning: {warning}\n")
    if args.new_version and result.get("state") == "staged":
        sys.stderr.write(
            f"note: version {result.get('version')} is staged: users keep the version they "
            f"get; try it as {args.name}@{result.get('version')}, then `preft adapter "
            "evaluate`, `canary` or `promote` it (--promote serves an upload at once)\n"
        )
    return result


def cmd_convert(args: argparse.Namespace) -> int:
    """Local: adapter_model.bin -> adapter_model.safetensors (torch.load weights_only)."""
    from preft_serve.adapters.peft_convert import ConvertError, convert_adapter

    try:
        written = convert_adapter(
            Path(args.path), Path(args.out) if args.out else None, overwrite=args.force
        )
    except ConvertError as exc:
        raise CliError(str(exc)) from None
    sys.stdout.write(
        f"wrote {written}; upload with: preft adapter upload {written.parent} "
        "--name NAME --mode prefill\n"
    )
    return 0


def cmd_list(reg: Registry, args: argparse.Namespace) -> Any:
    return list_pages(reg, "/v1/adapters", args)


def cmd_download(reg: Registry, args: argparse.Namespace) -> Any:
    """Write the stored files into a folder that ``preft adapter upload`` takes back as is."""
    out = Path(args.out or args.name)
    clash = [n for n in (CONFIG_FILE, WEIGHTS_FILE) if (out / n).exists()]
    if clash and not args.force:
        raise CliError(
            f"{out} already holds {' and '.join(clash)}; pass --force to replace "
            "them or --out another folder"
        )
    if out.exists() and not out.is_dir():
        raise CliError(f"{out} exists and is not a folder")
    params = {"version": args.version} if args.version else None
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".download-") as tmp:
        archive = Path(tmp) / "adapter.tar.gz"
        with open(archive, "wb") as fh:
            headers = reg.download(
                f"/v1/adapters/{args.name}/download",
                fh,
                params=params,
                progress=lambda total: progress_bar(
                    total,
                    f"downloading {args.name}",
                    show_progress(args.progress, args.quiet)
                    and (args.progress or total >= PROGRESS_MIN_BYTES),
                ),
            )
        _extract(archive, Path(tmp))
        sha256 = headers.get("x-preft-sha256", "")
        actual = file_digest((Path(tmp) / CONFIG_FILE).read_bytes(), Path(tmp) / WEIGHTS_FILE)
        if sha256 and actual != sha256:
            raise CliError(f"the download hashes to {actual}, not {sha256}; try again")
        for name in (WEIGHTS_FILE, CONFIG_FILE):
            os.replace(Path(tmp) / name, out / name)
    return {
        "name": args.name,
        "version": int(headers.get("x-preft-version", 0)),
        "sha256": actual,
        "path": str(out),
    }


def _extract(archive: Path, dest: Path) -> None:
    """Only the two adapter files, by name, as regular files (nothing else is trusted)."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for name in (CONFIG_FILE, WEIGHTS_FILE):
                member = tar.getmember(name)
                source = tar.extractfile(member) if member.isfile() else None
                if source is None:
                    raise KeyError(name)
                with source, open(dest / name, "wb") as target:
                    shutil.copyfileobj(source, target)
    except (tarfile.TarError, KeyError, EOFError, OSError) as exc:
        raise CliError(f"the registry's archive is unusable ({exc!r})") from None


def cmd_rollback(reg: Registry, args: argparse.Namespace) -> Any:
    return reg.call("POST", f"/v1/adapters/{args.name}/rollback", json={"version": args.version})


def add_parser(groups: Any, leaf: Any) -> None:
    adapter = groups.add_parser(
        "adapter",
        help="upload, list, show, download, roll back and delete adapters; stage, "
        "promote and canary their versions",
    )
    a_sub = adapter.add_subparsers(dest="action", required=True)
    up = leaf(
        a_sub,
        "upload",
        "Upload an adapter folder (adapter_config.json + "
        "adapter_model.safetensors) or a .tar.gz/.zip of it",
        cmd_upload,
    )
    up.add_argument("path", help="adapter folder or archive")
    up.add_argument(
        "--name", required=True, type=adapter_name, help="adapter name within your tenant"
    )
    up.add_argument(
        "--mode",
        choices=[m.value for m in AdapterMode],
        help="prefill (PreFT: prompt tokens only) or all (classic); required for a "
        "new adapter, defaults to the current mode with --new-version",
    )
    up.add_argument(
        "--new-version",
        action="store_true",
        help="upload the next version of an existing adapter (staged unless --promote)",
    )
    up.add_argument(
        "--strict",
        action="store_true",
        help="refuse the upload instead of accepting it with warnings (e.g. a "
        "base_model_name_or_path naming another model)",
    )
    up.add_argument(
        "--promote",
        action="store_true",
        help="serve the new version to every user at once (the hot swap; it skips the "
        "evaluation gate). Default: staged, users keep the version they get; try it as "
        "NAME@VERSION, then `preft adapter evaluate`, `canary` or `promote` it",
    )
    _progress_flags(up, "upload")
    with_examples(
        up,
        "examples:\n"
        "  preft adapter upload ./my-adapter --name support-bot --mode prefill\n"
        "  preft adapter upload ./my-adapter-v2 --name support-bot --new-version\n"
        "  preft adapter upload ./my-adapter-v3 --name support-bot --new-version --promote\n"
        "  preft adapter upload ./my-adapter.tar.gz --name other-bot --mode all --strict",
    )
    conv = a_sub.add_parser(
        "convert",
        help="Convert a PEFT adapter saved as adapter_model.bin to safetensors "
        "(local; needs torch)",
        description="Read adapter_model.bin (or .pt) with "
        "torch.load(weights_only=True) and write adapter_model.safetensors next to it, or "
        "into --out with a copy of adapter_config.json",
    )
    conv.add_argument("path", help="adapter folder, or its adapter_model.bin")
    conv.add_argument("--out", help="output folder (default: the adapter's folder)")
    conv.add_argument(
        "--force", action="store_true", help="overwrite an existing adapter_model.safetensors"
    )
    conv.set_defaults(local=cmd_convert)
    ls = leaf(a_sub, "list", "List your adapters", cmd_list)
    add_paging_options(ls)
    show = leaf(
        a_sub,
        "show",
        "Show an adapter and its version history",
        lambda r, a: r.call("GET", f"/v1/adapters/{a.name}"),
    )
    show.add_argument("name", type=adapter_name)
    down = leaf(
        a_sub,
        "download",
        "Download an adapter's stored files into a folder that "
        "`preft adapter upload` accepts back unchanged",
        cmd_download,
    )
    down.add_argument("name", type=adapter_name)
    down.add_argument("--version", type=int, help="which version (default: the current one)")
    down.add_argument("--out", help="folder to write (default: ./NAME)")
    down.add_argument("--force", action="store_true", help="replace files already there")
    _progress_flags(down, "download")
    back = leaf(
        a_sub,
        "rollback",
        "Make an earlier version's content current again (as a new "
        "version; bound users move to it at once)",
        cmd_rollback,
    )
    back.add_argument("name", type=adapter_name)
    back.add_argument("version", type=int, help="the version to go back to")
    with_examples(
        back,
        "example:\n"
        "  preft adapter rollback support-bot 1   # version 1's content, as a new version\n\n"
        "To serve an earlier version again without writing a new one: "
        "preft adapter promote NAME VERSION",
    )
    add_policy_parsers(a_sub, leaf)
    add_evaluation_parsers(a_sub, leaf)
    rm = leaf(
        a_sub,
        "delete",
        "Delete an adapter and its history",
        lambda r, a: r.call(
            "DELETE", f"/v1/adapters/{a.name}", params={"force": "true"} if a.force else None
        ),
    )
    rm.add_argument("name", type=adapter_name)
    rm.add_argument("--force", action="store_true", help="also unbind users bound to it")


def _progress_flags(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--progress",
        action="store_true",
        help=f"always show {what} progress on stderr (default: only on a "
        "terminal, for 1 MB or more)",
    )
    parser.add_argument("--quiet", action="store_true", help=f"never show {what} progress")
