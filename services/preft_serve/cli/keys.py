"""``preft key ...`` (an admin-role key): create, list, show and revoke the tenant's own API
keys. Input is checked here before anything is sent, so a typo never reaches the registry;
the registry checks it again (it is the authority)."""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from typing import Any

from preft_serve.cli.client import Registry
from preft_serve.cli.helptext import with_examples
from preft_serve.common.key_roles import KeyRole

ROLES = tuple(r.value for r in KeyRole)
# The registry's bounds (registry.schemas: KEY_NAME_PATTERN, KEY_MIN_TTL_S, KEY_MAX_TTL_S),
# restated so the CLI need not import the registry; tests compare the two.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._@-]{0,63}")
NAME_MAX = 64
MIN_TTL_S = 60
MAX_TTL_S = 5 * 365 * 86400
KEY_ID_RE = re.compile(r"[0-9a-f]{12}")
_TTL_RE = re.compile(r"([0-9]{1,12})([smhdw]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_TEXT_MAX = 64  # longest flag value echoed back or parsed


def _shown(text: str) -> str:
    return repr(text if len(text) <= _TEXT_MAX else text[:_TEXT_MAX] + "...")


def role(text: str) -> str:
    if text not in ROLES:
        raise argparse.ArgumentTypeError(
            f"unknown role {_shown(text)}: use one of {', '.join(ROLES)}"
        )
    return text


def key_name(text: str) -> str:
    if len(text) > NAME_MAX or NAME_RE.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(
            f"key name {_shown(text)} is invalid: use 1-{NAME_MAX} letters, digits, spaces "
            "or '.', '_', '@', '-', starting with a letter or digit"
        )
    return text


def ttl(text: str) -> int:
    """``30d``, ``12h``, ``90m``, ``3600s`` or plain seconds, within the registry's bounds."""
    match = _TTL_RE.fullmatch(text.strip().lower()) if len(text) <= _TEXT_MAX else None
    if match is None:
        raise argparse.ArgumentTypeError(
            f"ttl {_shown(text)} is not a duration: use a number with s, m, h, d or w "
            "(e.g. 30d, 12h, 3600s)"
        )
    seconds = int(match[1]) * _UNIT_S[match[2]]
    if not MIN_TTL_S <= seconds <= MAX_TTL_S:
        raise argparse.ArgumentTypeError(
            f"ttl {_shown(text)} is {seconds} seconds: use {MIN_TTL_S} seconds to "
            f"{MAX_TTL_S // 86400} days"
        )
    return seconds


def expires_at(text: str) -> str:
    """An RFC 3339 time with an offset, at least a minute ahead and within the bound; sent as
    given (the registry parses it again)."""
    try:
        when = dt.datetime.fromisoformat(text) if len(text) <= _TEXT_MAX else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None or "T" not in text.upper():
        raise argparse.ArgumentTypeError(
            f"expires-at {_shown(text)} is not an RFC 3339 time with an offset: use e.g. "
            "2027-01-31T12:00:00Z"
        )
    ahead = (when - dt.datetime.now(dt.UTC)).total_seconds()
    if not MIN_TTL_S <= ahead <= MAX_TTL_S:
        raise argparse.ArgumentTypeError(
            f"expires-at {_shown(text)} must lie {MIN_TTL_S} seconds to "
            f"{MAX_TTL_S // 86400} days from now"
        )
    return text


def key_id(text: str) -> str:
    if text.startswith("pft_"):
        raise argparse.ArgumentTypeError(
            "pass the key id (the 12 hex digits `preft key list` shows), not the key itself: "
            "a key's secret never belongs on a command line"
        )
    if KEY_ID_RE.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(
            f"key id {_shown(text)} is invalid: use the 12 hex digits `preft key list` shows"
        )
    return text


def cmd_create(reg: Registry, args: argparse.Namespace) -> Any:
    body: dict[str, Any] = {"role": args.role}
    if args.name is not None:
        body["name"] = args.name
    if args.ttl is not None:
        body["ttl_s"] = args.ttl
    if args.expires_at is not None:
        body["expires_at"] = args.expires_at
    created = reg.call("POST", "/v1/keys", json=body)
    sys.stderr.write(
        "warning: this is the only time the key is shown (only its hash is stored); "
        "save it now (`preft login --url URL --context NAME` reads it from stdin)\n"
    )
    return created


EXAMPLES_CREATE = """examples:
  preft key create --role inference --name chat-app --ttl 30d
  preft key create --role developer --name ci-deploy --expires-at 2027-01-31T12:00:00Z
  preft --json key create --role inference | jq -r .api_key \\
      | preft login --url https://gateway:8080 --context chat

roles (a key may create keys of its own role or lower):
  admin      everything in the tenant: its keys, the audit log, and all below
  developer  adapters, user bindings, files, fine-tuning, usage, and all below
  inference  chat, completions, responses, tokenize, models

The key is printed once, on stdout; only its hash is stored. Without --ttl or --expires-at
it never expires; either sets an expiry 60 seconds to 1825 days ahead."""


def add_parser(groups: Any, leaf: Any) -> None:
    key = groups.add_parser(
        "key",
        help="create, list, show and revoke your tenant's API keys (needs an admin-role key)",
        description="Manage your tenant's own API keys with an admin-role key: each key has "
        "a role (admin, developer, inference), an optional name and an optional expiry.",
    )
    k_sub = key.add_subparsers(dest="action", required=True)
    create = leaf(
        k_sub,
        "create",
        "Create a key with a role; prints its secret once",
        cmd_create,
    )
    with_examples(create, EXAMPLES_CREATE)
    create.add_argument(
        "--role", required=True, type=role, metavar="ROLE", help=f"one of {', '.join(ROLES)}"
    )
    create.add_argument(
        "--name",
        type=key_name,
        help=f"a label for people (1-{NAME_MAX} letters, digits, spaces or ._@-)",
    )
    expiry = create.add_mutually_exclusive_group()
    expiry.add_argument(
        "--ttl",
        type=ttl,
        metavar="DURATION",
        help="expire after this long: 30d, 12h, 90m, 3600s (60 s to 1825 days)",
    )
    expiry.add_argument(
        "--expires-at",
        type=expires_at,
        metavar="TIME",
        help="expire at this RFC 3339 time with an offset, e.g. 2027-01-31T12:00:00Z",
    )
    ls = leaf(
        k_sub,
        "list",
        "List the tenant's keys, oldest first: role, name, expiry, last use (no secrets)",
        lambda r, a: r.call("GET", "/v1/keys"),
    )
    with_examples(ls, "example:\n  preft key list")
    show = leaf(
        k_sub,
        "show",
        "Show one key: role, name, expiry, who created it, when it was last used",
        lambda r, a: r.call("GET", f"/v1/keys/{a.key_id}"),
    )
    show.add_argument("key_id", type=key_id, metavar="KEY_ID", help="12 hex digits")
    with_examples(show, "example:\n  preft key show 3f9c0e1a2b4d")
    revoke = leaf(
        k_sub,
        "revoke",
        "Revoke a key: refused everywhere within a second (the last admin key cannot be "
        "revoked: create another admin key first)",
        lambda r, a: r.call("DELETE", f"/v1/keys/{a.key_id}"),
    )
    revoke.add_argument("key_id", type=key_id, metavar="KEY_ID", help="12 hex digits")
    with_examples(revoke, "example:\n  preft key revoke 3f9c0e1a2b4d")
