"""Per-tenant storage quotas, checked on upload before anything is stored.

``max_adapters``: adapter names a tenant holds. ``max_stored_bytes``: the sizes of the
distinct contents (sha256) its adapters' versions reference, old versions included (they
stay downloadable and rollback targets). The check runs before the content is written, not
inside the commit transaction, so two concurrent uploads may both pass it: a quota is a
bound on runaway use, not an exact ledger.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from preft_serve.common.errors import QuotaExceeded
from preft_serve.common.registry_client import RegistryKeys


@dataclass(frozen=True)
class Quota:
    max_adapters: int
    max_stored_bytes: int


@dataclass(frozen=True)
class TenantUse:
    adapters: int
    stored_bytes: int
    contents: frozenset[str]  # sha256 of every version's content


def tenant_use(client: Any, keys: RegistryKeys, tenant: str) -> TenantUse:
    """What ``tenant`` holds now (one ZRANGE, then one pipelined HVALS per adapter)."""
    names = client.zrange(keys.adapters(tenant), 0, -1)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hvals(keys.versions(tenant, name))
    sizes: dict[str, int] = {}
    for records in pipe.execute() if names else []:
        for raw in records:
            record = json.loads(raw)
            sizes[record["sha256"]] = int(record["size_bytes"])
    return TenantUse(len(names), sum(sizes.values()), frozenset(sizes))


def check_upload(quota: Quota, use: TenantUse, tenant: str, *, new_adapter: bool,
                 sha256: str, size_bytes: int) -> None:
    """Raise :class:`QuotaExceeded` (naming the limit and the current use) if storing this
    content (under a new name when ``new_adapter``) would go over ``quota``."""
    if new_adapter and use.adapters >= quota.max_adapters:
        raise QuotaExceeded(
            f"tenant {tenant} has {use.adapters} adapters, its quota is "
            f"{quota.max_adapters} (max_adapters); delete one before creating another")
    if sha256 not in use.contents and use.stored_bytes + size_bytes > quota.max_stored_bytes:
        raise QuotaExceeded(
            f"tenant {tenant} stores {use.stored_bytes} bytes of adapter content; this "
            f"upload's {size_bytes} bytes would exceed its quota of {quota.max_stored_bytes} "
            "bytes (max_stored_bytes); delete adapters (and their old versions) first")
