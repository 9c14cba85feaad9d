"""Naming rules for tenants, adapters, users and API key ids, with messages that say what is
allowed. The rules themselves live in ``registry_client.contract`` (names become parts of
Redis keys, and the clients check them too); every route checks its names here first."""

from __future__ import annotations

import datetime as dt
import re

from preft_serve.common.domain_errors import InvalidRequest
from preft_serve.common.registry_client import (
    is_adapter_name,
    is_tenant_name,
    is_user_id,
)
from preft_serve.common.text import shown

_KEY_ID = re.compile(r"[0-9a-f]{12}")

# The same rules spelled as JSON Schema patterns, for the OpenAPI document only (the routes'
# path parameters, ``routers/path_params.py``): routes still check names with the functions
# below (400 with a message), never by schema (422).
TENANT_PATTERN = r"^[a-z0-9][a-z0-9-]{1,62}$"
ADAPTER_PATTERN = r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
USER_PATTERN = r"^[A-Za-z0-9._@+=-]{1,128}$"
KEY_ID_PATTERN = r"^[0-9a-f]{12}$"


def check_tenant_name(name: str) -> str:
    if not is_tenant_name(name):
        raise InvalidRequest(
            f"tenant name {shown(name)} is invalid: use 2-63 lowercase letters, "
            "digits or '-', starting with a letter or digit"
        )
    return name


def check_adapter_name(name: str) -> str:
    if not is_adapter_name(name):
        raise InvalidRequest(
            f"adapter name {shown(name)} is invalid: use 1-64 letters, digits, "
            "'.', '_' or '-', starting with a letter or digit (no '..')"
        )
    return name


def check_user_id(user: str) -> str:
    if not is_user_id(user):
        raise InvalidRequest(
            f"user id {shown(user)} is invalid: use 1-128 letters, digits or "
            "'.', '_', '@', '+', '=', '-'"
        )
    return user


def check_bindable_user_id(user: str) -> str:
    """A user id a binding may be stored under: a valid one, other than '.' and '..',
    which no URL path can name (clients fold them), so such a binding could never be
    read or removed through the API."""
    check_user_id(user)
    if user in (".", ".."):
        raise InvalidRequest(
            f"user id {user!r} cannot be bound: URLs fold '.' and '..' path segments, so "
            "the binding could never be read or removed; choose another id"
        )
    return user


def check_key_id(key_id: str) -> str:
    if _KEY_ID.fullmatch(key_id) is None:
        raise InvalidRequest(
            f"key id {shown(key_id)} is invalid: key ids are 12 lowercase hex "
            "characters, as GET /v1/tenants/{tenant}/keys lists them"
        )
    return key_id


def check_cursor(cursor: str) -> str:
    """A page cursor is the last adapter name of the previous page."""
    if not is_adapter_name(cursor):
        raise InvalidRequest(
            f"cursor {shown(cursor)} is invalid: pass the next_cursor of the "
            "previous page (an adapter name)"
        )
    return cursor


def utcnow() -> str:
    """Timestamps are ISO 8601 UTC strings, stored and returned as-is."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
