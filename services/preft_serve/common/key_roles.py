"""API key roles and what each may do: the one table the registry and the gateway check.

Roles are ranked, each allowing what the ones below it do:

- ``inference``: chat, completions, responses, tokenize, models (reading them);
- ``developer``: also adapters, user bindings, files, fine-tuning and usage;
- ``admin``: everything in its tenant, also its keys, its audit log and its settings.

A route belongs to a family, the first segment after ``/v1/`` of its path
(``/v1/fine_tuning/jobs/{id}`` is ``fine_tuning``; ``/tokenize``, outside ``/v1``, is
``tokenize``); each family needs a least role.
A path of no listed family needs ``admin``, so a tenant route added later is closed to
the lesser roles until it is listed here. Key records without a role (the operator's
keys, and keys made before roles existed) are ``admin``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from preft_serve.common.domain_errors import DomainError


class KeyRole(enum.StrEnum):
    ADMIN = "admin"
    DEVELOPER = "developer"
    INFERENCE = "inference"


DEFAULT_ROLE = KeyRole.ADMIN  # a stored key without a role
_RANK: Mapping[KeyRole, int] = {KeyRole.INFERENCE: 0, KeyRole.DEVELOPER: 1, KeyRole.ADMIN: 2}


class Permission(enum.StrEnum):
    INFERENCE = "inference"
    ADAPTERS = "adapters"
    USERS = "users"
    FILES = "files"
    FINE_TUNING = "fine_tuning"
    USAGE = "usage"
    KEYS = "keys"
    AUDIT = "audit"
    TENANT = "tenant"  # tenant settings, and any route no family names


LEAST_ROLE: Mapping[Permission, KeyRole] = {
    Permission.INFERENCE: KeyRole.INFERENCE,
    Permission.ADAPTERS: KeyRole.DEVELOPER,
    Permission.USERS: KeyRole.DEVELOPER,
    Permission.FILES: KeyRole.DEVELOPER,
    Permission.FINE_TUNING: KeyRole.DEVELOPER,
    Permission.USAGE: KeyRole.DEVELOPER,
    Permission.KEYS: KeyRole.ADMIN,
    Permission.AUDIT: KeyRole.ADMIN,
    Permission.TENANT: KeyRole.ADMIN,
}
"""The least role each permission needs: the role -> permission table."""

FAMILIES: Mapping[str, Permission] = {
    "chat": Permission.INFERENCE,
    "completions": Permission.INFERENCE,
    "responses": Permission.INFERENCE,
    "tokenize": Permission.INFERENCE,
    "detokenize": Permission.INFERENCE,
    "version": Permission.INFERENCE,
    "models": Permission.INFERENCE,  # reading; DELETE removes an adapter (below)
    "adapters": Permission.ADAPTERS,
    "users": Permission.USERS,
    "files": Permission.FILES,
    "fine_tuning": Permission.FINE_TUNING,
    "usage": Permission.USAGE,
    "keys": Permission.KEYS,
    "audit": Permission.AUDIT,
}
"""Route family (the path's first segment after ``/v1/``) -> the permission it needs."""

_READS = frozenset({"GET", "HEAD", "OPTIONS"})
# What a refusal says the key cannot do: (reading, changing).
_ACTIONS: Mapping[Permission, tuple[str, str]] = {
    Permission.INFERENCE: ("run inference", "run inference"),
    Permission.ADAPTERS: ("read adapters", "upload or change adapters"),
    Permission.USERS: ("read user bindings", "change user bindings"),
    Permission.FILES: ("read files", "upload or delete files"),
    Permission.FINE_TUNING: ("read fine-tuning jobs", "create or cancel fine-tuning jobs"),
    Permission.USAGE: ("read usage", "read usage"),
    Permission.KEYS: ("read API keys", "create or revoke API keys"),
    Permission.AUDIT: ("read the audit log", "read the audit log"),
    Permission.TENANT: ("read tenant settings", "change tenant settings"),
}


class InsufficientRole(DomainError):
    """The key is valid but its role does not allow this route (403)."""

    code = "insufficient_role"


def parse_role(raw: str | None) -> KeyRole:
    """A stored role: none is :data:`DEFAULT_ROLE`; an unreadable one the least role, so a
    damaged record never grants more than it was meant to."""
    if raw is None or raw == "":
        return DEFAULT_ROLE
    try:
        return KeyRole(raw)
    except ValueError:
        return KeyRole.INFERENCE


def at_least(role: KeyRole, least: KeyRole) -> bool:
    """Whether ``role`` ranks at or above ``least``."""
    return _RANK[role] >= _RANK[least]


def family_of(path: str) -> str:
    """A path's route family: its first segment after ``/v1/``, or its first segment for
    routes outside ``/v1`` (vLLM's ``/tokenize``, ``/detokenize``, ``/version``)."""
    segments = [s for s in path.split("/", 3) if s]
    if segments[:1] == ["v1"] and len(segments) > 1:
        return segments[1]
    return segments[0] if segments else ""


def route_path(template: str | None, url_path: str) -> str:
    """What to classify a request by: its route's template, unless the family is a path
    parameter there (a catch-all), then the path requested."""
    if template is None or "{" in family_of(template):
        return url_path
    return template


def permission_for(method: str, path: str) -> Permission:
    """The permission a request to ``path`` (a route's path or template) needs."""
    family = family_of(path)
    permission = FAMILIES.get(family, Permission.TENANT)
    if family == "models" and method.upper() not in _READS:
        return Permission.ADAPTERS  # DELETE /v1/models/{model} deletes the adapter
    return permission


def roles_allowed(permission: Permission) -> list[KeyRole]:
    """The roles that may use ``permission``, least first."""
    least = LEAST_ROLE[permission]
    return sorted((r for r in KeyRole if at_least(r, least)), key=_RANK.__getitem__)


def check(role: KeyRole, method: str, path: str) -> None:
    """Raise :class:`InsufficientRole` when ``role`` may not make this request."""
    permission = permission_for(method, path)
    if at_least(role, LEAST_ROLE[permission]):
        return
    reading, changing = _ACTIONS[permission]
    action = reading if method.upper() in _READS else changing
    allowed = " or ".join(r.value for r in roles_allowed(permission))
    raise InsufficientRole(
        f"this key's role '{role.value}' cannot {action}; use a key with role {allowed}"
    )
