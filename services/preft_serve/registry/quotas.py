"""Per-tenant storage quotas, checked on upload before anything is stored.

``max_adapters``: adapter names a tenant holds. ``max_stored_bytes``: the sizes of the
distinct contents (sha256) its adapters' versions reference, old versions included (they
stay downloadable and rollback targets). The check runs before the content is written, not
inside the commit transaction, so two concurrent uploads may both pass it: a quota is a
bound on runaway use, not an exact ledger.

The limits are the registry's defaults (``PREFT_REGISTRY_TENANT_MAX_ADAPTERS``,
``PREFT_REGISTRY_TENANT_MAX_STORED_BYTES``) unless an admin set the tenant's own
(:class:`QuotaOverrides`, kept as ``quota_*`` fields of the tenant's Redis hash, so they go
with the tenant when it is deleted). The overrides are read in the same round trip as the
use, so a changed quota applies to the next upload.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, field_validator

from preft_serve.common.domain_errors import QuotaExceeded
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.common.tenant_rate_limits import integral_float_to_int

MAX_ADAPTERS_LIMIT = 1_000_000
"""Largest per-tenant adapter quota an admin may set (a typo guard, not a capacity)."""
MAX_STORED_BYTES_LIMIT = 1 << 50
"""Largest per-tenant stored-bytes quota an admin may set: 1 PiB."""


class QuotaOverrides(BaseModel):
    """A tenant's own storage quotas; a field left null uses the registry's default, 0
    refuses every new adapter (or new content). Strict integers: ``"5"``, ``5.5`` and
    ``true`` are refused, not converted (``5.0`` is 5: JSON has one number type)."""

    model_config = {"extra": "forbid"}

    max_adapters: int | None = Field(
        None,
        ge=0,
        le=MAX_ADAPTERS_LIMIT,
        strict=True,
        description="Adapters the tenant may hold (null: PREFT_REGISTRY_TENANT_MAX_ADAPTERS)",
    )
    max_stored_bytes: int | None = Field(
        None,
        ge=0,
        le=MAX_STORED_BYTES_LIMIT,
        strict=True,
        description="Bytes of distinct adapter content, all versions (null: "
        "PREFT_REGISTRY_TENANT_MAX_STORED_BYTES)",
    )

    @field_validator("max_adapters", "max_stored_bytes", mode="before")
    @classmethod
    def _integral_float_as_int(cls, value: Any) -> Any:
        return integral_float_to_int(value)


QUOTA_FIELDS: tuple[str, ...] = tuple(QuotaOverrides.model_fields)
RECORD_FIELDS: tuple[str, ...] = tuple(f"quota_{name}" for name in QUOTA_FIELDS)
"""The overrides' fields in the tenant's Redis hash (absent = the default)."""


def overrides_from_record(values: Mapping[str, str | None] | list[str | None]) -> QuotaOverrides:
    """The overrides from the tenant hash: a mapping (HGETALL) or the values of
    :data:`RECORD_FIELDS` in order (HMGET)."""
    if not isinstance(values, Mapping):
        values = dict(zip(RECORD_FIELDS, values, strict=True))
    return QuotaOverrides(
        **{
            name: int(raw)
            for name, field in zip(QUOTA_FIELDS, RECORD_FIELDS)
            if (raw := values.get(field)) is not None
        }
    )


def record_changes(overrides: QuotaOverrides, fields: set[str]) -> tuple[dict[str, str], list[str]]:
    """(HSET mapping, HDEL fields) that apply ``fields`` of ``overrides`` to the tenant
    hash: a value is stored, a null removes the override."""
    stored: dict[str, str] = {}
    removed: list[str] = []
    for name, field in zip(QUOTA_FIELDS, RECORD_FIELDS):
        if name in fields:
            value = getattr(overrides, name)
            if value is None:
                removed.append(field)
            else:
                stored[field] = str(value)
    return stored, removed


@dataclass(frozen=True)
class Quota:
    max_adapters: int
    max_stored_bytes: int

    def apply(self, overrides: QuotaOverrides) -> Quota:
        """These defaults with the tenant's own limits on top."""
        return dataclasses.replace(
            self, **{k: v for k, v in overrides.model_dump().items() if v is not None}
        )


@dataclass(frozen=True)
class TenantUse:
    adapters: int
    stored_bytes: int
    contents: frozenset[str]  # sha256 of every version's content
    # The tenant's own limits, read in the same round trip.
    overrides: QuotaOverrides = dataclasses.field(default_factory=QuotaOverrides)


def tenant_use(client: Any, keys: RegistryKeys, tenant: str) -> TenantUse:
    """What ``tenant`` holds now and its quota overrides (one pipelined ZRANGE + HMGET,
    then one pipelined HVALS per adapter)."""
    first = client.pipeline(transaction=False)
    first.zrange(keys.adapters(tenant), 0, -1)
    first.hmget(keys.tenant(tenant), list(RECORD_FIELDS))
    names, overrides = first.execute()
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hvals(keys.versions(tenant, name))
    sizes: dict[str, int] = {}
    for records in pipe.execute() if names else []:
        for raw in records:
            record = json.loads(raw)
            sizes[record["sha256"]] = int(record["size_bytes"])
    return TenantUse(
        len(names), sum(sizes.values()), frozenset(sizes), overrides_from_record(overrides)
    )


def _which(name: str, default: Quota, overrides: QuotaOverrides) -> str:
    """``(max_adapters)``, or for the tenant's own limit also what the default is."""
    if getattr(overrides, name) is None:
        return f"({name})"
    return f"({name}, this tenant's own; the default is {getattr(default, name)})"


def check_upload(
    quota: Quota, use: TenantUse, tenant: str, *, new_adapter: bool, sha256: str, size_bytes: int
) -> None:
    """Raise :class:`QuotaExceeded` (naming the limit and the current use) if storing this
    content (under a new name when ``new_adapter``) would go over ``quota``, or over the
    tenant's own limits where it has them (``use.overrides``)."""
    limits = quota.apply(use.overrides)
    if new_adapter and use.adapters >= limits.max_adapters:
        which = _which("max_adapters", quota, use.overrides)
        raise QuotaExceeded(
            f"tenant {tenant} has {use.adapters} adapters, its quota is "
            f"{limits.max_adapters} {which}; delete one before creating another"
        )
    if sha256 not in use.contents and use.stored_bytes + size_bytes > limits.max_stored_bytes:
        which = _which("max_stored_bytes", quota, use.overrides)
        raise QuotaExceeded(
            f"tenant {tenant} stores {use.stored_bytes} bytes of adapter content; this "
            f"upload's {size_bytes} bytes would exceed its quota of {limits.max_stored_bytes} "
            f"bytes {which}; delete adapters (and their old versions) first"
        )
