"""``preft adapter policy | promote | canary``: an adapter's serving policy (which version
users get, and an optional canary version for a share of them).

Names, versions and weights are checked here before anything is sent (the registry checks
them again). ``canary`` keeps the policy's served version and changes only the split: it
reads the policy first, so it needs no version of the caller's to say what stays served.
"""

from __future__ import annotations

import argparse
from typing import Any

from preft_serve.cli.client import CliError, Registry
from preft_serve.cli.helptext import with_examples
from preft_serve.cli.ids import adapter_name, user_id
from preft_serve.common.version_split import WEIGHT_DECIMALS, weight_units

MAX_VERSION = 999_999_999  # registry.policy_schemas.MAX_VERSION: nine digits at most
_TEXT_MAX = 64


def _shown(text: str) -> str:
    return repr(text if len(text) <= _TEXT_MAX else text[:_TEXT_MAX] + "...")


def version(text: str) -> int:
    number = int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else 0
    if not 1 <= number <= MAX_VERSION:
        raise argparse.ArgumentTypeError(
            f"version {_shown(text)} is invalid: use a version number (1 to {MAX_VERSION}) "
            "that `preft adapter policy NAME` lists"
        )
    return number


def weight(text: str) -> float:
    try:
        if len(text) > _TEXT_MAX:
            raise ValueError("is too long")
        weight_units(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"--weight {_shown(text)}: {exc}; use a share of users strictly between 0 and 1 "
            f"with at most {WEIGHT_DECIMALS} decimals, e.g. 0.1"
        ) from None
    return float(text)


def cmd_policy(reg: Registry, args: argparse.Namespace) -> Any:
    params = {"user": args.user} if args.user else None
    return reg.call("GET", f"/v1/adapters/{args.name}/policy", params=params)


def cmd_promote(reg: Registry, args: argparse.Namespace) -> Any:
    params = {"force": "true"} if args.force else None
    return reg.call(
        "POST", f"/v1/adapters/{args.name}/versions/{args.version}/promote", params=params
    )


def cmd_canary(reg: Registry, args: argparse.Namespace) -> Any:
    if args.off == (args.version is not None):
        raise CliError("give a canary VERSION with --weight, or --off (not both)")
    if args.version is not None and args.weight is None:
        raise CliError("--weight is required with a canary VERSION (e.g. --weight 0.1)")
    if args.off and args.weight is not None:
        raise CliError("--weight goes with a canary VERSION, not with --off")
    # The PUT names the served version read here; If-Match makes the registry refuse it
    # (412, nothing changed) should someone change the policy in between, rather than
    # serve the version read here again.
    read = reg.answer("GET", f"/v1/adapters/{args.name}/policy")
    etag = read.headers.get("etag")
    canary = None if args.off else {"version": args.version, "weight": args.weight}
    return reg.call(
        "PUT",
        f"/v1/adapters/{args.name}/policy",
        json={"version": read.json()["version"], "canary": canary},
        headers={"If-Match": etag} if etag else None,
    )


def add_policy_parsers(a_sub: Any, leaf: Any) -> None:
    pol = leaf(
        a_sub,
        "policy",
        "Show an adapter's serving policy: the version users get, the canary if any, and "
        "every version with its state (staged, serving, retired)",
        cmd_policy,
    )
    pol.add_argument("name", type=adapter_name)
    pol.add_argument(
        "--user", type=user_id, help="also say which version this user id gets (and why)"
    )
    with_examples(
        pol,
        "examples:\n"
        "  preft adapter policy support-bot\n"
        "  preft adapter policy support-bot --user alice   # alice's version: serving or canary",
    )
    prom = leaf(
        a_sub,
        "promote",
        "Serve VERSION to every user at once, ending any canary: promote a staged version, "
        "or go back to an older one without writing a new version",
        cmd_promote,
    )
    prom.add_argument("name", type=adapter_name)
    prom.add_argument("version", type=version, help="the version to serve")
    prom.add_argument(
        "--force",
        action="store_true",
        help="promote a staged version without a passing evaluation result (audited)",
    )
    with_examples(
        prom,
        "examples:\n"
        "  preft adapter upload ./v2 --name support-bot --new-version\n"
        "  preft adapter promote support-bot 2   # everyone gets version 2\n"
        "  preft adapter promote support-bot 1   # back to version 1",
    )
    can = leaf(
        a_sub,
        "canary",
        "Serve another version to a share of users (a stable hash of adapter and user id "
        "decides who, so a user keeps their version and raising the weight only adds "
        "users), or end the canary with --off; the served version stays as it is (if "
        "someone changes the policy while this runs, nothing is changed and it says so)",
        cmd_canary,
    )
    can.add_argument("name", type=adapter_name)
    can.add_argument("version", type=version, nargs="?", help="the canary version")
    can.add_argument(
        "--weight",
        type=weight,
        help=f"share of users who get the canary: 0 < weight < 1, at most {WEIGHT_DECIMALS} "
        "decimals",
    )
    can.add_argument(
        "--off", action="store_true", help="end the canary: everyone gets the served version"
    )
    with_examples(
        can,
        "examples:\n"
        "  preft adapter canary support-bot 2 --weight 0.1   # 10% of users get version 2\n"
        "  preft adapter canary support-bot 2 --weight 0.5   # the same users, and more\n"
        "  preft adapter canary support-bot --off            # everyone back on the served one\n"
        "  preft adapter promote support-bot 2               # or: everyone on version 2",
    )
