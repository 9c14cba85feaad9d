"""preft: the command line for preft-serve (over its REST API).

Every tenant command works against the gateway's URL alone, the one base URL that also
serves chat: the gateway forwards adapters, users, usage, keys, files, fine-tuning and the
audit log to the adapter registry with the same key. The registry's own URL works too; the
operator's `preft tenant` commands that change tenants need it (a gateway given the admin
token serves `tenant list`, `show` and reading `limits`).

Examples:

    preft login --url https://gateway:8080 --context prod    # key: prompted, or piped on stdin
    preft adapter upload ./my-adapter --name support-bot --mode prefill
    preft adapter upload ./my-adapter-v2 --name support-bot --new-version
    preft adapter rollback support-bot 1          # version 1's content, as version 3
    preft adapter upload ./v4 --name support-bot --new-version   # staged: serves nobody yet
    preft adapter canary support-bot 4 --weight 0.1   # 10% of users get version 4
    preft adapter promote support-bot 4           # everyone gets version 4
    preft adapter policy support-bot --user alice # versions, states, alice's version
    preft adapter download support-bot --out ./support-bot
    preft adapter convert ./old-adapter           # adapter_model.bin -> .safetensors (local)
    preft user bind alice support-bot
    preft user list --adapter support-bot
    preft adapter list
    preft usage --start 2026-03-01 --end 2026-03-31
    preft usage --by user --group-by hour --since 2026-03-01T00:00:00Z
    preft key create --role inference --name chat-app --ttl 30d   # printed once
    preft key list | preft key revoke KEY_ID
    preft audit --since 2026-03-01 --action binding.set --all   # who changed what
    preft fine-tune create data.jsonl --model base --suffix alice --follow
    preft fine-tune checkpoints ftjob-...
    preft --output json adapter list              # the API's JSON, for scripts
    PREFT_ADMIN_TOKEN=... preft tenant create acme
    PREFT_ADMIN_TOKEN=... preft tenant list

Contexts (keys never on the command line):

    preft login --url URL [--context NAME] < keyfile   # checked against the URL, then saved
    preft context list | preft context use NAME | preft context current
    preft logout [NAME]                           # or: preft context delete NAME
    preft --context staging adapter list          # one command against another context

Local commands (no registry needed):

    preft model prepare smollm2-135m-instruct      # a real base model in var/models/
    preft train data.jsonl --model var/models/smollm2-135m-instruct --out my-adapter
    source <(preft completion bash)               # tab completion (zsh: completion zsh)

Output: --output table (default) prints tables and key/value lines for people; --output json
(or --json) prints the registry's JSON response as it sent it.

Where the URL and key come from, first match wins for each: --url / --api-key; the context
--context NAME names; PREFT_REGISTRY_URL / PREFT_API_KEY; the current context; the URL
http://127.0.0.1:8081. A context's key goes only to its own URL. Tenant commands take the
admin token from --admin-token or PREFT_ADMIN_TOKEN (never from a context). Contexts live in
$PREFT_CONFIG, else $XDG_CONFIG_HOME/preft/config.yaml (default ~/.config/preft/config.yaml),
mode 0600.

Exit status: 0 success, 1 the registry refused or could not be reached (the message says
why; with --output json the error is {"error": {...}} on stdout), 2 bad command line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from importlib import metadata
from typing import Any, NoReturn

from preft_serve.basemodels.cli import add_parser as add_model_parser
from preft_serve.cli import (
    adapter,
    audit,
    completion,
    contexts,
    files,
    finetune,
    keys,
    tenant,
    usage,
    user,
)
from preft_serve.cli.client import CliError, Registry
from preft_serve.cli.credentials import resolve
from preft_serve.cli.output import QUIET, render, report_error
from preft_serve.training.cli import add_parser as add_train_parser

__all__ = ["CliError", "Registry", "build_parser", "main"]
OUTPUTS = ("table", "json")
_EPILOG_START = "Where the URL and key come from"


# What a gateway answers a tenant command: no such route (an older gateway), a write (the
# gateway reads tenants only), or no admin token configured there.
GATEWAY_TENANT_REFUSALS = ("unknown_url", "method_not_allowed", "operator_not_configured")


def _version() -> str:
    try:
        return metadata.version("preft-serve")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _add_common(parser: argparse.ArgumentParser, suppress: bool, api_key: bool = True) -> None:
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--url",
        default=default,
        help="the gateway's URL (or the registry's; tenant commands: the registry's) (env "
        "PREFT_REGISTRY_URL, else the context's, else http://127.0.0.1:8081)",
    )
    if api_key:
        parser.add_argument(
            "--api-key",
            default=default,
            help="tenant API key (env PREFT_API_KEY, else the context's; "
            "prefer `preft login`, which keeps it off the command line)",
        )
        parser.add_argument(
            "--context",
            default=default,
            metavar="NAME",
            help="use this saved context instead of the current one",
        )
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default=default,
        help="table: for people (default); json: the registry's JSON "
        'response as it sent it (errors too, as {"error": ...})',
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="the same as --output json",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=argparse.SUPPRESS if suppress else 600,
        help="seconds to wait for the registry (default 600)",
    )


def _as_json(parser: argparse.ArgumentParser, args: argparse.Namespace) -> bool:
    """``--output`` / ``--json`` as one choice, which commands read as ``args.json``."""
    output = getattr(args, "output", None)
    if args.json and output == "table":
        parser.error("--json and --output table contradict each other; give one")
    args.json = bool(args.json or output == "json")
    return bool(args.json)


_UNRECOGNIZED = "unrecognized arguments: "
_SECRET_OPTION = re.compile(r"(--api-key(?:=|\s+))\S+")


class _Parser(argparse.ArgumentParser):
    """argparse echoes what it did not understand ("unrecognized arguments: --api-key
    sk-..."): a key given where no command takes one must not reach the terminal or CI logs."""

    def error(self, message: str) -> NoReturn:
        head, echoed, rest = message.partition(_UNRECOGNIZED)
        super().error(head + echoed + _SECRET_OPTION.sub(r"\1***", rest) if echoed else message)


def build_parser() -> argparse.ArgumentParser:
    # The docstring's last paragraphs (credentials, exit status) close --help, after the options.
    description, marker, epilog = (__doc__ or "").partition(_EPILOG_START)
    parser = _Parser(
        prog="preft",
        description=description,
        epilog=marker + epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"preft {_version()}")
    _add_common(parser, suppress=False)
    groups = parser.add_subparsers(
        dest="group",
        required=True,
        metavar="{login,logout,context,adapter,key,user,usage,audit,files,"
        "fine-tune,tenant,model,train,completion}",
    )

    def leaf(sub: Any, name: str, help_: str, func: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_, description=help_)
        _add_common(p, suppress=True)
        p.set_defaults(func=func)
        return p

    contexts.add_parsers(groups, lambda p: _add_common(p, suppress=True, api_key=False))
    adapter.add_parser(groups, leaf)
    keys.add_parser(groups, leaf)
    user.add_parser(groups, leaf)
    usage.add_parser(groups, leaf)
    audit.add_parser(groups, leaf)
    files.add_parser(groups, leaf)
    finetune.add_parser(groups, leaf)
    tenant.add_parser(groups, leaf)
    # Local commands: they set `local` and never talk to the registry.
    add_model_parser(groups)
    add_train_parser(groups)
    completion.add_parser(groups)
    return parser


def _busy(message: str) -> None:
    """A transfer-slot refusal the client waits out (stderr: --output json keeps stdout)."""
    print(f"registry busy: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    as_json = _as_json(parser, args)
    if getattr(args, "local", None) is not None:
        try:
            return int(args.local(args))
        except CliError as exc:
            return report_error(exc, as_json)
    command = f"{args.group} {args.action}"
    admin = args.group == "tenant"
    try:
        target = resolve(args.url, args.api_key, args.context, want_key=not admin)
    except CliError as exc:
        return report_error(exc, as_json)
    if admin:
        token = args.admin_token or os.environ.get("PREFT_ADMIN_TOKEN")
        if not token:
            parser.error("tenant commands need the admin token: --admin-token or PREFT_ADMIN_TOKEN")
    else:
        token = target.api_key
        if not token:
            parser.error(target.missing_key())
    registry = Registry(target.url, token, args.timeout, on_busy=_busy)
    try:
        result = args.func(registry, args)
    except CliError as exc:
        if admin and exc.error.get("code") in GATEWAY_TENANT_REFUSALS:  # a gateway's URL
            exc = CliError(
                f"{target.url} does not serve this tenant command ({exc}): a gateway only "
                "reads tenants, with the admin token it was given; tenant commands go to the "
                "adapter registry's URL, not the gateway's; pass --url REGISTRY_URL",
                code="not_the_registry",
                status=exc.status,
            )
        return report_error(exc, as_json)
    if result is QUIET:
        return 0
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    elif result is not None:
        render(result, command, sys.stdout)
    else:
        sys.stdout.write("ok\n")
    return 0
