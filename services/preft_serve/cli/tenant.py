"""``preft tenant ...`` (admin token): create, list, show and delete tenants, their keys,
rate limits, storage quotas and serving settings."""

from __future__ import annotations

import argparse
from typing import Any

from preft_serve.cli.client import CliError, Registry
from preft_serve.cli.ids import tenant_name
from preft_serve.cli.keys import key_id
from preft_serve.common.tenant_serving import UnboundUser

LIMIT_FLAGS = ("tenant_rps", "tenant_burst", "user_rps", "user_burst", "tenant_tpm", "user_tpm")
QUOTA_FLAGS = ("max_adapters", "max_stored_bytes")
DEFAULT = "default"


def _quota_value(text: str) -> int | None:
    """A quota flag's value: a whole number, or ``default`` (drop the tenant's own limit;
    the registry validates the range)."""
    if text == DEFAULT:
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number or '{DEFAULT}', got {text!r}"
        ) from None


def _quota(args: argparse.Namespace) -> dict[str, int | None]:
    """The quota flags given (an absent flag is not in the dict: it changes nothing)."""
    return {f: getattr(args, f) for f in QUOTA_FLAGS if hasattr(args, f)}


TENANT_PAGE = 1000  # the registry's largest page
MAX_PAGES = 10_000  # a registry that kept answering "next" forever would stop here


def cmd_list(reg: Registry, args: argparse.Namespace) -> Any:
    """Every tenant: the registry answers a page at a time (``Link: rel="next"``)."""
    tenants: list[Any] = []
    path = f"/v1/tenants?limit={TENANT_PAGE}"
    for _ in range(MAX_PAGES):
        answer = reg.answer("GET", path)  # (params= would replace the link's query)
        tenants += answer.json()
        following = answer.links.get("next", {}).get("url")
        if not following:
            return tenants
        if not following.startswith("/v1/tenants?"):  # the admin token goes with it
            raise CliError(
                f"the registry's next page is not a tenant list of its own: {following[:200]!r}"
            )
        path = following
    raise CliError(f"the registry listed more than {MAX_PAGES} pages of tenants; stopped")


def cmd_create(reg: Registry, args: argparse.Namespace) -> Any:
    body: dict[str, Any] = {"name": args.tenant}
    if quota := _quota(args):
        body["quota"] = quota
    return reg.call("POST", "/v1/tenants", json=body)


def cmd_set_quota(reg: Registry, args: argparse.Namespace) -> Any:
    quota = _quota(args)
    if not quota:
        raise CliError(
            "nothing to change: give --max-adapters and/or --max-stored-bytes "
            f"(a number, or '{DEFAULT}' for the registry's default)"
        )
    return reg.call("PATCH", f"/v1/tenants/{args.tenant}", json={"quota": quota})


def cmd_set_unbound_user(reg: Registry, args: argparse.Namespace) -> Any:
    value = None if args.value == DEFAULT else args.value
    return reg.call("PATCH", f"/v1/tenants/{args.tenant}", json={"unbound_user": value})


def _quota_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-adapters",
        type=_quota_value,
        default=argparse.SUPPRESS,
        metavar="N",
        help="adapters the tenant may hold ('default': the "
        "registry's PREFT_REGISTRY_TENANT_MAX_ADAPTERS)",
    )
    parser.add_argument(
        "--max-stored-bytes",
        type=_quota_value,
        default=argparse.SUPPRESS,
        metavar="BYTES",
        help="bytes of adapter content, all versions "
        "('default': PREFT_REGISTRY_TENANT_MAX_STORED_BYTES)",
    )


def cmd_limits(reg: Registry, args: argparse.Namespace) -> Any:
    path = f"/v1/tenants/{args.tenant}/limits"
    values = {f: getattr(args, f) for f in LIMIT_FLAGS if getattr(args, f) is not None}
    if not values and not args.clear:
        return reg.call("GET", path)
    return reg.call("PUT", path, json=values)


def cmd_delete(reg: Registry, args: argparse.Namespace) -> Any:
    if not args.yes:
        raise CliError(
            f"deleting tenant {args.tenant!r} revokes its API keys and removes its "
            "bindings, adapters and their stored contents; pass --yes to confirm"
        )
    return reg.call("DELETE", f"/v1/tenants/{args.tenant}")


def _admin(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--admin-token", help="admin token (env PREFT_ADMIN_TOKEN)")
    return parser


def add_parser(groups: Any, leaf: Any) -> None:
    tenant = groups.add_parser(
        "tenant",
        help="admin: create, list and delete tenants and "
        "manage their keys (needs --admin-token or PREFT_ADMIN_TOKEN)",
    )
    t_sub = tenant.add_subparsers(dest="action", required=True)
    _admin(
        leaf(
            t_sub,
            "list",
            "List tenants with their number of adapters",
            cmd_list,
        )
    )
    create = _admin(
        leaf(
            t_sub,
            "create",
            "Create a tenant; prints its API key once. "
            "--max-adapters / --max-stored-bytes give it its own storage quotas",
            cmd_create,
        )
    )
    create.add_argument("tenant", type=tenant_name)
    _quota_flags(create)
    for name, help_, func in [
        (
            "show",
            "Show a tenant, its key ids and its own quotas",
            lambda r, a: r.call("GET", f"/v1/tenants/{a.tenant}"),
        ),
        (
            "new-key",
            "Issue another API key (rotation); prints it once",
            lambda r, a: r.call("POST", f"/v1/tenants/{a.tenant}/keys"),
        ),
    ]:
        _admin(leaf(t_sub, name, help_, func)).add_argument("tenant", type=tenant_name)
    delete = _admin(
        leaf(
            t_sub,
            "delete",
            "Delete a tenant: revoke its keys, remove its "
            "bindings and adapters, and delete stored contents no other tenant "
            "uses",
            cmd_delete,
        )
    )
    delete.add_argument("tenant", type=tenant_name)
    delete.add_argument("--yes", action="store_true", help="confirm the deletion")
    revoke = _admin(
        leaf(
            t_sub,
            "revoke-key",
            "Revoke one API key by its key id",
            lambda r, a: r.call("DELETE", f"/v1/tenants/{a.tenant}/keys/{a.key_id}"),
        )
    )
    revoke.add_argument("tenant", type=tenant_name)
    revoke.add_argument("key_id", type=key_id, metavar="KEY_ID", help="12 hex digits")
    limits = _admin(
        leaf(
            t_sub,
            "limits",
            "Show a tenant's rate-limit overrides, or replace "
            "them with the given flags (unset flags fall back to the gateway's "
            "defaults; 0 turns a limit off)",
            cmd_limits,
        )
    )
    limits.add_argument("tenant", type=tenant_name)
    limits.add_argument(
        "--rps", dest="tenant_rps", type=float, help="requests/s for the whole tenant"
    )
    limits.add_argument("--burst", dest="tenant_burst", type=int, help="tenant bucket size")
    limits.add_argument("--user-rps", type=float, help="requests/s per user")
    limits.add_argument("--user-burst", type=int, help="per-user bucket size")
    limits.add_argument(
        "--tpm", dest="tenant_tpm", type=float, help="output tokens/minute for the whole tenant"
    )
    limits.add_argument("--user-tpm", type=float, help="output tokens/minute per user")
    limits.add_argument("--clear", action="store_true", help="remove every override")
    set_quota = _admin(
        leaf(
            t_sub,
            "set-quota",
            "Set a tenant's own storage quotas (flags "
            "not given are unchanged; 'default' goes back to the registry's "
            "default); the next upload is checked against them",
            cmd_set_quota,
        )
    )
    set_quota.add_argument("tenant", type=tenant_name)
    _quota_flags(set_quota)
    unbound = _admin(
        leaf(
            t_sub,
            "set-unbound-user",
            "What a user without an adapter "
            "binding gets when a request names the base model: base_model "
            "(its answer; the default) or not_found (404); 'default' goes "
            "back to the default",
            cmd_set_unbound_user,
        )
    )
    unbound.add_argument("tenant", type=tenant_name)
    unbound.add_argument("value", choices=[*(u.value for u in UnboundUser), DEFAULT])
