"""``preft usage``: the requests and tokens the gateway counted, per UTC day and model."""

from __future__ import annotations

import argparse
from typing import Any

from preft_serve.cli.client import Registry


def cmd_usage(reg: Registry, args: argparse.Namespace) -> Any:
    params = {k: v for k, v in (("start", args.start), ("end", args.end)) if v}
    return reg.call("GET", "/v1/usage", params=params or None)


def add_parser(groups: Any, leaf: Any) -> None:
    usage = leaf(
        groups,
        "usage",
        "Show requests and tokens per UTC day and model "
        "(default: the last 7 days; at most 92 at once)",
        cmd_usage,
    )
    usage.set_defaults(action="show")
    usage.add_argument("--start", help="first day, YYYY-MM-DD (included)")
    usage.add_argument("--end", help="last day, YYYY-MM-DD (included; default today)")
