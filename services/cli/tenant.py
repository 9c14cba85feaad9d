"""``preft tenant ...`` (admin token): create, list, show and delete tenants, their keys and
rate limits."""

from __future__ import annotations

import argparse
from typing import Any

from preft_serve.cli.client import CliError, Registry

LIMIT_FLAGS = ("tenant_rps", "tenant_burst", "user_rps", "user_burst", "tenant_tpm", "user_tpm")


def cmd_limits(reg: Registry, args: argparse.Namespace) -> Any:
    path = f"/v1/tenants/{args.tenant}/limits"
    values = {f: getattr(args, f) for f in LIMIT_FLAGS if getattr(args, f) is not None}
    if not values and not args.clear:
        return reg.call("GET", path)
    return reg.call("PUT", path, json=values)


def cmd_delete(reg: Registry, args: argparse.Namespace) -> Any:
    if not args.yes:
        raise CliError(f"deleting tenant {args.tenant!r} revokes its API keys and removes its "
                       "bindings, adapters and their stored contents; pass --yes to confirm")
    return reg.call("DELETE", f"/v1/tenants/{args.tenant}")


def _admin(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--admin-token", help="admin token (env PREFT_ADMIN_TOKEN)")
    return parser


def add_parser(groups: Any, leaf: Any) -> None:
    tenant = groups.add_parser("tenant", help="admin: create, list and delete tenants and "
                               "manage their keys (needs --admin-token or PREFT_ADMIN_TOKEN)")
    t_sub = tenant.add_subparsers(dest="action", required=True)
    _admin(leaf(t_sub, "list", "List tenants with their number of adapters",
                lambda r, a: r.call("GET", "/v1/tenants")))
    for name, help_, func in [
        ("create", "Create a tenant; prints its API key once",
         lambda r, a: r.call("POST", "/v1/tenants", json={"name": a.tenant})),
        ("show", "Show a tenant and its key ids",
         lambda r, a: r.call("GET", f"/v1/tenants/{a.tenant}")),
        ("new-key", "Issue another API key (rotation); prints it once",
         lambda r, a: r.call("POST", f"/v1/tenants/{a.tenant}/keys")),
    ]:
        _admin(leaf(t_sub, name, help_, func)).add_argument("tenant")
    delete = _admin(leaf(t_sub, "delete", "Delete a tenant: revoke its keys, remove its "
                         "bindings and adapters, and delete stored contents no other tenant "
                         "uses", cmd_delete))
    delete.add_argument("tenant")
    delete.add_argument("--yes", action="store_true", help="confirm the deletion")
    revoke = _admin(leaf(t_sub, "revoke-key", "Revoke one API key by its key id",
                         lambda r, a: r.call("DELETE",
                                             f"/v1/tenants/{a.tenant}/keys/{a.key_id}")))
    revoke.add_argument("tenant")
    revoke.add_argument("key_id")
    limits = _admin(leaf(t_sub, "limits", "Show a tenant's rate-limit overrides, or replace "
                         "them with the given flags (unset flags fall back to the gateway's "
                         "defaults; 0 turns a limit off)", cmd_limits))
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
