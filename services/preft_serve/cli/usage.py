"""``preft usage``: the requests and tokens the gateway counted, per UTC day and model, or
broken down per model, user, API key or served adapter version and per UTC day or hour."""

from __future__ import annotations

import argparse
from typing import Any

from preft_serve.cli.client import Registry

BREAKDOWN = ("group_by", "by", "since", "until")


def cmd_usage(reg: Registry, args: argparse.Namespace) -> Any:
    names = ("start", "end", *BREAKDOWN)
    params = {name: value for name in names if (value := getattr(args, name, None))}
    return reg.call("GET", "/v1/usage", params=params or None)


def add_parser(groups: Any, leaf: Any) -> None:
    usage = leaf(
        groups,
        "usage",
        "Show requests and tokens per UTC day and model (default: the last 7 days; at most "
        "92 at once), or with --by/--group-by/--since/--until per model, user, key or "
        "adapter version and per day or hour",
        cmd_usage,
    )
    usage.set_defaults(action="show")
    usage.add_argument("--start", help="first day, YYYY-MM-DD (included)")
    usage.add_argument("--end", help="last day, YYYY-MM-DD (included; default today)")
    when = "RFC 3339 (2026-03-01T12:00:00Z), a date, or unix seconds"
    usage.add_argument(
        "--by",
        choices=["model", "user", "key", "version"],
        help="break down per model, user id, API key id (the first 100 of each day or "
        "hour by name, the rest as other) or served adapter version (name@version, with "
        "its errors and mean time to first token)",
    )
    usage.add_argument(
        "--group-by",
        dest="group_by",
        choices=["day", "hour"],
        help="one row per UTC day (default; at most 92) or hour (the last 7 days; at most "
        "168 at once)",
    )
    usage.add_argument("--since", metavar="T", help=f"breakdown from the bucket holding T: {when}")
    usage.add_argument(
        "--until", metavar="T", help=f"breakdown to the bucket holding T (default now): {when}"
    )
