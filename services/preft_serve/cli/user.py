"""``preft user ...``: bind users to adapters, show, list and unbind them."""

from __future__ import annotations

import argparse
from typing import Any

from preft_serve.cli.client import Registry, add_paging_options, list_pages
from preft_serve.cli.ids import adapter_name, user_id


def cmd_list(reg: Registry, args: argparse.Namespace) -> Any:
    return list_pages(reg, "/v1/users", args, {"adapter": args.adapter} if args.adapter else None)


def add_parser(groups: Any, leaf: Any) -> None:
    user = groups.add_parser("user", help="bind users to adapters")
    u_sub = user.add_subparsers(dest="action", required=True)
    bind = leaf(
        u_sub,
        "bind",
        "Bind a user to an adapter (replaces any binding)",
        lambda r, a: r.call("PUT", f"/v1/users/{a.user}", json={"adapter": a.adapter}),
    )
    bind.add_argument("user", type=user_id)
    bind.add_argument("adapter", type=adapter_name)
    leaf(
        u_sub,
        "show",
        "Show the adapter a user is bound to",
        lambda r, a: r.call("GET", f"/v1/users/{a.user}"),
    ).add_argument("user", type=user_id)
    ls = leaf(u_sub, "list", "List bound users and their adapters", cmd_list)
    ls.add_argument("--adapter", help="only the users bound to this adapter")
    add_paging_options(ls, default_limit=1000)
    leaf(
        u_sub,
        "unbind",
        "Remove a user's binding (they get the base model)",
        lambda r, a: r.call("DELETE", f"/v1/users/{a.user}"),
    ).add_argument("user", type=user_id)
