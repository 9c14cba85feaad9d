"""preft: the command line for the preft-serve adapter registry (over its REST API).

Examples:

    export PREFT_REGISTRY_URL=http://registry:8081 PREFT_API_KEY=pft_...
    preft adapter upload ./my-adapter --name support-bot --mode prefill
    preft adapter upload ./my-adapter-v2 --name support-bot --new-version
    preft adapter convert ./old-adapter           # adapter_model.bin -> .safetensors (local)
    preft user bind alice support-bot
    preft adapter list
    PREFT_ADMIN_TOKEN=... preft tenant create acme

Local commands (no registry needed):

    preft model prepare smollm2-135m-instruct      # a real base model in var/models/
    preft train data.jsonl --model var/models/smollm2-135m-instruct --out my-adapter

Exit status: 0 success, 1 the registry refused or could not be reached (the message says
why), 2 bad command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import IO, Any, NoReturn

import httpx
from preft_serve.common.adapter_format import CONFIG_FILE, WEIGHTS_FILE, AdapterMode
from preft_serve.models.cli import add_parser as add_model_parser
from preft_serve.training.cli import add_parser as add_train_parser

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
PROGRESS_MIN_BYTES = 1 << 20  # smaller uploads finish before a progress line helps


class CliError(Exception):
    """A failure to report as ``error: <message>`` with exit status 1."""


class _Progress:
    """Shared byte counter for the files of one upload, drawn on stderr."""

    def __init__(self, total: int, label: str, stream: IO[str]) -> None:
        self.total, self.label, self.stream = total, label, stream
        self.done: dict[int, int] = {}
        self.last_pct = -1

    def update(self, key: int, position: int) -> None:
        self.done[key] = position
        pct = int(100 * sum(self.done.values()) / max(self.total, 1))
        if pct != self.last_pct:
            self.last_pct = pct
            sent = sum(self.done.values()) / 1e6
            end = "\n" if pct >= 100 else ""
            self.stream.write(f"\ruploading {self.label}: {sent:.1f}/{self.total / 1e6:.1f} MB "
                              f"({pct}%){end}")
            self.stream.flush()


class _ProgressFile:
    """A binary file that reports how far httpx has read it."""

    def __init__(self, path: Path, progress: _Progress | None) -> None:
        self._fh = open(path, "rb")  # noqa: SIM115  (closed by the upload command)
        self._progress = progress
        self.name = str(path)

    def read(self, size: int = -1) -> bytes:
        chunk = self._fh.read(size)
        if self._progress is not None:
            self._progress.update(id(self), self._fh.tell())
        return chunk

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def fileno(self) -> int:
        return self._fh.fileno()

    def close(self) -> None:
        self._fh.close()


class Registry:
    """Thin REST client; every non-2xx answer becomes a :class:`CliError` with its message."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers,
                                 timeout=httpx.Timeout(timeout, connect=10))

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self.http.request(method, path, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise CliError(f"cannot reach the registry at {self.url} ({exc}); check --url or "
                           "PREFT_REGISTRY_URL") from None
        except httpx.TransportError as exc:
            raise CliError(f"the connection to {self.url} failed during the request ({exc!r}); "
                           "if this was an upload, it may exceed the registry's size limit"
                           ) from None
        if resp.status_code >= 400:
            try:
                message = resp.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = resp.text.strip() or resp.reason_phrase
            raise CliError(f"{message} (HTTP {resp.status_code})")
        return resp.json() if resp.content else None


def _upload_parts(path: Path) -> list[Path]:
    if path.is_file():
        if not path.name.lower().endswith(ARCHIVE_SUFFIXES):
            raise CliError(f"{path} is a file but not an archive; pass the adapter folder or a "
                           f"{'/'.join(ARCHIVE_SUFFIXES)} archive of it")
        return [path]
    if not path.is_dir():
        raise CliError(f"{path} does not exist")
    missing = [n for n in (CONFIG_FILE, WEIGHTS_FILE) if not (path / n).is_file()]
    if missing:
        pickles = sorted(p.name for p in path.glob("*") if p.suffix in (".bin", ".pt", ".pth"))
        hint = (f"; found {', '.join(pickles)}: convert it to safetensors with "
                f"`preft adapter convert {path}`") if pickles else ""
        raise CliError(f"{path} lacks {' and '.join(missing)}{hint}")
    return [path / CONFIG_FILE, path / WEIGHTS_FILE]


def cmd_adapter_upload(reg: Registry, args: argparse.Namespace) -> Any:
    parts = _upload_parts(Path(args.path))
    total = sum(p.stat().st_size for p in parts)
    show = not args.quiet and (args.progress or (total >= PROGRESS_MIN_BYTES
                                                 and sys.stderr.isatty()))
    progress = _Progress(total, args.name, sys.stderr) if show else None
    handles = [_ProgressFile(p, progress) for p in parts]
    try:
        files = [("files", (p.name, h, "application/octet-stream"))
                 for p, h in zip(parts, handles)]
        data = {"mode": args.mode} if args.mode else {}
        params = {"strict": "true"} if args.strict else None
        if args.new_version:
            result = reg.call("PUT", f"/v1/adapters/{args.name}", data=data, files=files,
                              params=params)
        elif not args.mode:
            raise CliError("--mode is required for a new adapter (prefill or all)")
        else:
            result = reg.call("POST", "/v1/adapters", data={**data, "name": args.name},
                              files=files, params=params)
    finally:
        for h in handles:
            h.close()
    for warning in result.get("warnings") or ():
        sys.stderr.write(f"warning: {warning}\n")
    return result


def cmd_adapter_convert(args: argparse.Namespace) -> int:
    """Local: adapter_model.bin -> adapter_model.safetensors (torch.load weights_only)."""
    from preft_serve.common.peft_convert import ConvertError, convert_adapter

    try:
        written = convert_adapter(Path(args.path), Path(args.out) if args.out else None,
                                  overwrite=args.force)
    except ConvertError as exc:
        _fail(str(exc))
    sys.stdout.write(f"wrote {written}; upload with: preft adapter upload {written.parent} "
                     "--name NAME --mode prefill\n")
    return 0


def cmd_adapter_list(reg: Registry, args: argparse.Namespace) -> Any:
    items: list[Any] = []
    cursor = None
    while True:
        params = {"limit": args.limit, **({"cursor": cursor} if cursor else {})}
        page = reg.call("GET", "/v1/adapters", params=params)
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None or not args.all:
            return {"items": items, "next_cursor": cursor}


def _print_table(rows: list[dict[str, Any]], columns: list[str], out: IO[str]) -> None:
    widths = [max([len(c)] + [len(str(r.get(c, ""))) for r in rows]) for c in columns]
    out.write("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip() + "\n")
    for r in rows:
        out.write("  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(columns, widths))
                  .rstrip() + "\n")


def _render(result: Any, command: str, out: IO[str]) -> None:
    if command == "adapter list":
        _print_table(result["items"], ["name", "version", "type", "mode", "rank", "bound_users",
                                       "sha256"], out)
        if result["next_cursor"]:
            out.write(f"(more: --all, or the next page after {result['next_cursor']!r})\n")
    elif command == "adapter show":
        for key in ("name", "version", "sha256", "type", "rank", "mode", "base_model",
                    "size_bytes", "bound_users", "created_at", "updated_at"):
            out.write(f"{key + ':':<13}{result[key]}\n")
        out.write("versions:\n")
        _print_table(result["versions"], ["version", "sha256", "mode", "created_at"], out)
    elif isinstance(result, dict):
        for key, value in result.items():
            if key == "warnings":
                continue  # printed on stderr by the command
            out.write(f"{key + ':':<13}{value}\n")


def _add_common(parser: argparse.ArgumentParser, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument("--url", default=default,
                        help="registry URL (env PREFT_REGISTRY_URL, default http://127.0.0.1:8081)")
    parser.add_argument("--api-key", default=default, help="tenant API key (env PREFT_API_KEY)")
    parser.add_argument("--json", action="store_true",
                        default=argparse.SUPPRESS if suppress else False,
                        help="print the raw JSON response")
    parser.add_argument("--timeout", type=float, default=argparse.SUPPRESS if suppress else 600,
                        help="seconds to wait for the registry (default 600)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="preft", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _add_common(parser, suppress=False)
    groups = parser.add_subparsers(dest="group", required=True,
                                   metavar="{adapter,user,tenant,model,train}")

    def leaf(sub: Any, name: str, help_: str, func: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        _add_common(p, suppress=True)
        p.set_defaults(func=func)
        return p

    adapter = groups.add_parser("adapter", help="upload, list, show and delete adapters")
    a_sub = adapter.add_subparsers(dest="action", required=True)
    up = leaf(a_sub, "upload", "Upload an adapter folder (adapter_config.json + "
              "adapter_model.safetensors) or a .tar.gz/.zip of it", cmd_adapter_upload)
    up.add_argument("path", help="adapter folder or archive")
    up.add_argument("--name", required=True, help="adapter name within your tenant")
    up.add_argument("--mode", choices=[m.value for m in AdapterMode],
                    help="prefill (PreFT: prompt tokens only) or all (classic); required for a "
                    "new adapter, defaults to the current mode with --new-version")
    up.add_argument("--new-version", action="store_true",
                    help="upload the next version of an existing adapter (hot swap)")
    up.add_argument("--strict", action="store_true",
                    help="refuse the upload instead of accepting it with warnings (e.g. a "
                    "base_model_name_or_path naming another model)")
    up.add_argument("--progress", action="store_true", help="always show upload progress")
    up.add_argument("--quiet", action="store_true", help="never show upload progress")
    conv = a_sub.add_parser(
        "convert", help="Convert a PEFT adapter saved as adapter_model.bin to safetensors "
        "(local; needs torch)", description="Read adapter_model.bin (or .pt) with "
        "torch.load(weights_only=True) and write adapter_model.safetensors next to it, or "
        "into --out with a copy of adapter_config.json")
    conv.add_argument("path", help="adapter folder, or its adapter_model.bin")
    conv.add_argument("--out", help="output folder (default: the adapter's folder)")
    conv.add_argument("--force", action="store_true",
                      help="overwrite an existing adapter_model.safetensors")
    conv.set_defaults(local=cmd_adapter_convert)
    ls = leaf(a_sub, "list", "List your adapters", cmd_adapter_list)
    ls.add_argument("--limit", type=int, default=100, help="page size (default 100)")
    ls.add_argument("--all", action="store_true", help="fetch every page")
    show = leaf(a_sub, "show", "Show an adapter and its version history",
                lambda r, a: r.call("GET", f"/v1/adapters/{a.name}"))
    show.add_argument("name")
    rm = leaf(a_sub, "delete", "Delete an adapter and its history",
              lambda r, a: r.call("DELETE", f"/v1/adapters/{a.name}",
                                  params={"force": "true"} if a.force else None))
    rm.add_argument("name")
    rm.add_argument("--force", action="store_true", help="also unbind users bound to it")

    user = groups.add_parser("user", help="bind users to adapters")
    u_sub = user.add_subparsers(dest="action", required=True)
    bind = leaf(u_sub, "bind", "Bind a user to an adapter (replaces any binding)",
                lambda r, a: r.call("PUT", f"/v1/users/{a.user}", json={"adapter": a.adapter}))
    bind.add_argument("user")
    bind.add_argument("adapter")
    leaf(u_sub, "show", "Show the adapter a user is bound to",
         lambda r, a: r.call("GET", f"/v1/users/{a.user}")).add_argument("user")
    leaf(u_sub, "unbind", "Remove a user's binding (they get the base model)",
         lambda r, a: r.call("DELETE", f"/v1/users/{a.user}")).add_argument("user")

    tenant = groups.add_parser("tenant", help="admin: create tenants and manage their keys "
                               "(needs --admin-token or PREFT_ADMIN_TOKEN)")
    t_sub = tenant.add_subparsers(dest="action", required=True)
    for name, help_, func in [
        ("create", "Create a tenant; prints its API key once",
         lambda r, a: r.call("POST", "/v1/tenants", json={"name": a.tenant})),
        ("show", "Show a tenant and its key ids", lambda r, a: r.call("GET",
                                                                      f"/v1/tenants/{a.tenant}")),
        ("new-key", "Issue another API key (rotation); prints it once",
         lambda r, a: r.call("POST", f"/v1/tenants/{a.tenant}/keys")),
    ]:
        p = leaf(t_sub, name, help_, func)
        p.add_argument("tenant")
        p.add_argument("--admin-token", help="admin token (env PREFT_ADMIN_TOKEN)")
    revoke = leaf(t_sub, "revoke-key", "Revoke one API key by its key id",
                  lambda r, a: r.call("DELETE", f"/v1/tenants/{a.tenant}/keys/{a.key_id}"))
    revoke.add_argument("tenant")
    revoke.add_argument("key_id")
    revoke.add_argument("--admin-token", help="admin token (env PREFT_ADMIN_TOKEN)")
    limits = leaf(t_sub, "limits", "Show a tenant's rate-limit overrides, or replace them "
                  "with the given flags (unset flags fall back to the gateway's defaults; "
                  "0 turns a limit off)", cmd_tenant_limits)
    limits.add_argument("tenant")
    limits.add_argument("--rps", dest="tenant_rps", type=float,
                        help="requests/s for the whole tenant")
    limits.add_argument("--burst", dest="tenant_burst", type=int, help="tenant bucket size")
    limits.add_argument("--user-rps", type=float, help="requests/s per user")
    limits.add_argument("--user-burst", type=int, help="per-user bucket size")
    limits.add_argument("--tpm", dest="tenant_tpm", type=float,
                        help="output tokens/minute for the whole tenant")
    limits.add_argument("--user-tpm", type=float, help="output tokens/minute per user")
    limits.add_argument("--clear", action="store_true", help="remove every override")
    limits.add_argument("--admin-token", help="admin token (env PREFT_ADMIN_TOKEN)")
    # Local commands: they set `local` and never talk to the registry.
    add_model_parser(groups)
    add_train_parser(groups)
    return parser


LIMIT_FLAGS = ("tenant_rps", "tenant_burst", "user_rps", "user_burst", "tenant_tpm", "user_tpm")


def cmd_tenant_limits(reg: Registry, args: argparse.Namespace) -> Any:
    path = f"/v1/tenants/{args.tenant}/limits"
    values = {f: getattr(args, f) for f in LIMIT_FLAGS if getattr(args, f) is not None}
    if not values and not args.clear:
        return reg.call("GET", path)
    return reg.call("PUT", path, json=values)


def _fail(message: str) -> NoReturn:
    sys.stderr.write(f"error: {message}\n")
    raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "local", None) is not None:
        return int(args.local(args))
    command = f"{args.group} {args.action}"
    url = args.url or os.environ.get("PREFT_REGISTRY_URL") or "http://127.0.0.1:8081"
    if args.group == "tenant":
        token = args.admin_token or os.environ.get("PREFT_ADMIN_TOKEN")
        if not token:
            parser.error("tenant commands need the admin token: --admin-token or "
                         "PREFT_ADMIN_TOKEN")
    else:
        token = args.api_key or os.environ.get("PREFT_API_KEY")
        if not token:
            parser.error("no API key: pass --api-key or set PREFT_API_KEY")
    registry = Registry(url, token, args.timeout)
    try:
        result = args.func(registry, args)
    except CliError as exc:
        _fail(str(exc))
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    elif result is not None:
        _render(result, command, sys.stdout)
    else:
        sys.stdout.write("ok\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
