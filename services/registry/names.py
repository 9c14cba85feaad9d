"""Naming rules for tenants, adapters and users, with messages that say what is allowed."""

from __future__ import annotations

import datetime as dt
import re

from preft_serve.common.errors import BadRequest

_TENANT = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}$")
_ADAPTER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_USER = re.compile(r"^[A-Za-z0-9._@+=-]{1,128}$")


def check_tenant_name(name: str) -> str:
    if not _TENANT.match(name):
        raise BadRequest(f"tenant name {name!r} is invalid: use 2-63 lowercase letters, digits "
                         "or '-', starting with a letter or digit")
    return name


def check_adapter_name(name: str) -> str:
    if not _ADAPTER.match(name) or ".." in name:
        raise BadRequest(f"adapter name {name!r} is invalid: use 1-64 letters, digits, '.', '_' "
                         "or '-', starting with a letter or digit (no '..')")
    return name


def check_user_id(user: str) -> str:
    if not _USER.match(user):
        raise BadRequest(f"user id {user!r} is invalid: use 1-128 letters, digits or "
                         "'.', '_', '@', '+', '=', '-'")
    return user


def utcnow() -> str:
    """Timestamps are ISO 8601 UTC strings, stored and returned as-is."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
