"""``preft audit``: who changed what in the tenant (the registry's ``GET /v1/audit``)."""

from __future__ import annotations

import argparse
from typing import Any

from preft_serve.cli.client import Registry


def cmd_audit(reg: Registry, args: argparse.Namespace) -> Any:
    """One page as the registry sent it; with ``--all``, every page from the first, joined
    into one list (``next_cursor`` null: nothing left)."""
    params: dict[str, Any] = {
        name: value
        for name, value in (
            ("since", args.since),
            ("until", args.until),
            ("actor", args.actor),
            ("action", args.action_name),
            ("limit", args.limit),
        )
        if value is not None
    }
    entries: list[Any] = []
    after = args.after
    while True:
        page = reg.call(
            "GET", "/v1/audit", params={**params, **({"after": after} if after else {})}
        )
        if not args.all:
            return page
        entries += page["data"]
        after = page["next_cursor"]
        if after is None:
            return {**page, "data": entries}


def add_parser(groups: Any, leaf: Any) -> None:
    audit = leaf(
        groups,
        "audit",
        "Show who changed what in your tenant (adapters, bindings, "
        "keys, files, fine-tuning jobs), oldest first",
        cmd_audit,
    )
    audit.set_defaults(action="show")  # the command's name; --action is the filter
    when = "RFC 3339 (2026-03-01T12:00:00Z), a date, or unix seconds"
    audit.add_argument("--since", metavar="T", help=f"entries at or after T: {when}")
    audit.add_argument("--until", metavar="T", help=f"entries at or before T: {when}")
    audit.add_argument("--actor", metavar="ID", help="an API key id, or `operator`")
    audit.add_argument(
        "--action",
        dest="action_name",
        metavar="A",
        help="one action, e.g. binding.set, adapter.upload, file.delete",
    )
    audit.add_argument(
        "--limit", type=int, metavar="N", help="entries per page, 1 to 500 (default 100)"
    )
    audit.add_argument(
        "--after",
        metavar="CURSOR",
        help="start after this entry id (the next_cursor a page ends with)",
    )
    audit.add_argument("--all", action="store_true", help="follow next_cursor to the end")
