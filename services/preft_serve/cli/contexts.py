"""``preft login``, ``preft logout`` and ``preft context ...``: named contexts (a URL, the
gateway's or the registry's, and an API key for it).

``login`` reads the key from stdin (piped) or a no-echo prompt (a terminal), never from the
command line, and saves it only after the registry accepted it. Listings show keys masked.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from typing import Any
from urllib.parse import urlsplit

from preft_serve.cli import config
from preft_serve.cli.client import CliError, Registry
from preft_serve.cli.credentials import unknown_context
from preft_serve.cli.output import print_table

MAX_KEY_INPUT = 4096


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> int:
    sys.stdout.write(json.dumps(data, indent=2) + "\n" if args.json else text)
    return 0


def read_key(url: str) -> str:
    """The API key from stdin: a no-echo prompt on a terminal, else the first line piped."""
    if sys.stdin.isatty():
        try:
            key = getpass.getpass(f"API key for {url}: ")
        except EOFError:
            key = ""
    else:
        key = sys.stdin.readline(MAX_KEY_INPUT + 1)
        if len(key) > MAX_KEY_INPUT:
            raise CliError(
                f"the key on stdin is longer than {MAX_KEY_INPUT} characters; "
                "pipe the API key alone",
                code="bad_key",
            )
    key = key.strip()
    if not key:
        raise CliError(
            "no API key on stdin: pipe it in (`preft login --url URL < keyfile`) or "
            "run `preft login` in a terminal to be prompted",
            code="bad_key",
        )
    try:
        return config.check_api_key(key)
    except ValueError as exc:
        raise CliError(f"{exc}; pipe the API key alone", code="bad_key") from None


def verify_key(url: str, key: str, timeout: float) -> None:
    """One cheap authenticated GET; a refusal means the key is not saved. A 403 for the
    key's role is no refusal: the key is valid (an inference key cannot read adapters,
    and is what ``preft completion`` needs)."""
    registry = Registry(url, key, timeout)
    try:
        registry.call("GET", "/v1/adapters", params={"limit": 1})
    except CliError as exc:
        if exc.status == 403 and exc.error.get("code") == "insufficient_role":
            return
        if exc.status in (401, 403):
            raise CliError(
                f"the registry at {url} rejected this key ({exc.message}); nothing "
                "was saved: check the key, or issue a new one with "
                "`preft tenant new-key TENANT`",
                code="key_rejected",
                status=exc.status,
            ) from None
        raise CliError(
            f"could not check the key against {url}, so nothing was saved: {exc.message}",
            code=str(exc.error.get("code") or "cli"),
            status=exc.status,
        ) from None
    finally:
        registry.http.close()


def default_name(url: str) -> str:
    """``host`` or ``host:port`` of the URL, as a context name."""
    netloc = urlsplit(url).netloc.rsplit("@", 1)[-1]
    return netloc if config.CONTEXT_NAME.fullmatch(netloc) else "default"


def cmd_login(args: argparse.Namespace) -> int:
    if getattr(args, "api_key", None):
        raise CliError(
            "login reads the API key from stdin or a prompt, never the command line "
            "(where ps and shell history see it); drop --api-key",
            code="cli",
        )
    url_text = args.url or _env_url()
    if not url_text:
        raise CliError(
            "login needs the gateway's (or the registry's) URL: --url URL (or PREFT_REGISTRY_URL)"
        )
    try:
        url = config.check_url(url_text)
        name = config.check_context_name(args.context or default_name(url))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    cfg = config.load()  # a broken file fails before the key is asked for
    key = read_key(url)
    verify_key(url, key, args.timeout)
    contexts = {**cfg.contexts, name: config.Context(url=url, api_key=key)}
    try:
        new = config.Config(contexts=contexts, current_context=name)
    except ValueError as exc:
        raise CliError(f"cannot add context {name!r}: {exc}") from None
    replaced = name in cfg.contexts
    path = config.save(new)
    shown = config.masked(key)
    note = (
        f", replacing its previous key {config.masked(cfg.contexts[name].api_key)}"
        if replaced
        else ""
    )
    return _emit(
        args,
        {"context": name, "url": url, "api_key": shown, "replaced": replaced, "config": str(path)},
        f"logged in to {url} as context {name!r} (key {shown}{note}), now current; "
        f"saved in {path}\n",
    )


def _env_url() -> str | None:
    return os.environ.get("PREFT_REGISTRY_URL") or None


def _delete(name: str | None, args: argparse.Namespace) -> int:
    cfg = config.load()
    if name is None:
        if cfg.current_context is None:
            raise CliError(
                "no current context to log out of; name one: `preft logout NAME` "
                f"(known: {', '.join(sorted(cfg.contexts)) or 'none'})",
                code="no_context",
            )
        name = cfg.current_context
    if name not in cfg.contexts:
        raise unknown_context(name, cfg)
    contexts = {k: v for k, v in cfg.contexts.items() if k != name}
    current = None if cfg.current_context == name else cfg.current_context
    path = config.save(config.Config(contexts=contexts, current_context=current))
    note = (
        " (it was current; pick another with `preft context use NAME`)"
        if current is None and cfg.current_context == name
        else ""
    )
    return _emit(
        args,
        {"deleted": name, "current_context": current, "config": str(path)},
        f"deleted context {name!r} and its key from {path}{note}\n",
    )


def cmd_logout(args: argparse.Namespace) -> int:
    return _delete(args.name, args)


def cmd_delete(args: argparse.Namespace) -> int:
    return _delete(args.name, args)


def cmd_list(args: argparse.Namespace) -> int:
    cfg = config.load()
    rows = [
        {
            "current": name == cfg.current_context,
            "name": name,
            "url": ctx.url,
            "api_key": config.masked(ctx.api_key),
        }
        for name, ctx in sorted(cfg.contexts.items())
    ]
    if args.json:
        return _emit(args, {"current_context": cfg.current_context, "contexts": rows}, "")
    if not rows:
        sys.stdout.write(
            f"no contexts in {config.config_path()}; add one with `preft login --url URL`\n"
        )
        return 0
    print_table(
        [{**r, "current": "*" if r["current"] else ""} for r in rows],
        ["current", "name", "url", "api_key"],
        sys.stdout,
    )
    return 0


def cmd_use(args: argparse.Namespace) -> int:
    cfg = config.load()
    if args.name not in cfg.contexts:
        raise unknown_context(args.name, cfg)
    path = config.save(config.Config(contexts=cfg.contexts, current_context=args.name))
    return _emit(
        args,
        {"current_context": args.name, "config": str(path)},
        f"current context: {args.name} ({cfg.contexts[args.name].url})\n",
    )


def cmd_current(args: argparse.Namespace) -> int:
    cfg = config.load()
    if cfg.current_context is None:
        raise CliError(
            f"no current context in {config.config_path()}; run `preft login --url "
            "URL` or `preft context use NAME`",
            code="no_context",
        )
    ctx = cfg.contexts[cfg.current_context]
    return _emit(
        args,
        {"name": cfg.current_context, "url": ctx.url, "api_key": config.masked(ctx.api_key)},
        f"{cfg.current_context}\n",
    )


def add_parsers(groups: Any, common: Any) -> None:
    """``login``, ``logout`` and ``context``; ``common(parser)`` adds the shared options
    except ``--api-key`` (login never takes a key from argv)."""
    login = groups.add_parser(
        "login",
        help="save a URL (the gateway's, or the registry's) and API key as a named context",
        description="Check an API key against the registry and save it, with the URL, as a "
        "named context in the config file (mode 0600), which becomes the current one. The key "
        "is read from stdin when piped, else prompted for without echo; never from the "
        "command line.",
    )
    common(login)
    login.add_argument(
        "--context",
        default=argparse.SUPPRESS,
        metavar="NAME",
        help="the context's name (default: the URL's host:port)",
    )
    login.set_defaults(local=cmd_login)

    logout = groups.add_parser(
        "logout",
        help="delete a context and its key (default: the current one)",
        description="Delete a context and its key from "
        "the config file (default: the current context).",
    )
    common(logout)
    logout.add_argument("name", nargs="?", default=None, metavar="NAME")
    logout.set_defaults(local=cmd_logout)

    context = groups.add_parser("context", help="list, switch and delete named contexts")
    c_sub = context.add_subparsers(dest="action", required=True)
    for action, help_, func in (
        ("list", "List contexts (* marks the current one; keys masked)", cmd_list),
        ("use", "Make NAME the current context", cmd_use),
        ("current", "Print the current context's name", cmd_current),
        ("delete", "Delete context NAME and its key", cmd_delete),
    ):
        p = c_sub.add_parser(action, help=help_, description=help_)
        common(p)
        if action in ("use", "delete"):
            p.add_argument("name", metavar="NAME")
        p.set_defaults(local=func)
