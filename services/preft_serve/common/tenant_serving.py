"""Per-tenant serving settings: the one declaration of their names and values.

The registry stores them in the tenant's record (``PATCH /v1/tenants/{tenant}``, fields of
the hash at ``RegistryKeys.tenant``) and the gateway reads them from there through a short
cache (``gateway.tenant_serving``).
"""

from __future__ import annotations

import enum


class UnboundUser(str, enum.Enum):
    """What a request gets that names the base model (``model`` = its public name) for a
    ``user`` with no adapter binding."""

    BASE_MODEL = "base_model"
    """The base model answers (``x-preft-adapter: none`` says so): users without an adapter
    yet still get answers."""
    NOT_FOUND = "not_found"
    """404 ``adapter_binding_not_found``: for tenants whose every user must be served by
    their own adapter, a missing binding is an error, never a silent base-model answer."""


UNBOUND_USER_FIELD = "unbound_user"
DEFAULT_UNBOUND_USER = UnboundUser.BASE_MODEL


def parse_unbound_user(raw: str | bytes | None) -> UnboundUser:
    """The stored value (absent, or one a newer registry wrote: the default)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    try:
        return UnboundUser(text) if text else DEFAULT_UNBOUND_USER
    except ValueError:
        return DEFAULT_UNBOUND_USER
