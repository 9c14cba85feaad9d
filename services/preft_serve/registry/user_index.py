"""The tenant's bound users in one sorted set, so that listing them reads a page at a time.

Bindings are one key per user plus a set per adapter, which answer "whose adapter?" and
"who is bound to it?" but not "the next 100 users": listing them all read every adapter's
set in one transaction, up to ``TENANT_MAX_USERS`` (100,000) ids in one answer, and a
tenant listing in a loop kept Redis busy for everyone. The index is a sorted set of user
ids, all at score 0, so Redis orders them by id and ``ZRANGE ... BYLEX`` reads the page
after a cursor in O(log n + page).

Every write that binds a new user or removes a binding keeps the index in the same
transaction (:mod:`preft_serve.registry.bindings`, adapter and tenant deletes). Bindings
made before the index existed are added once, the first time the tenant's users are
listed (:func:`ensure_index`), a few hundred at a time, and a marker records that it was
done. A binding removed while that runs may be added back to the index; a page drops, and
removes, every id whose binding no longer exists, so such an entry is never listed.
"""

from __future__ import annotations

from typing import Any

from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry.schemas import UserBinding
from preft_serve.registry.txn import Redis

BACKFILL_BATCH = 500
READ_BATCH = 1000  # index entries read at once with an adapter filter
SCAN_FACTOR = 10
"""With an adapter filter, a page reads at most this many index entries per item asked
for; past that it ends early with a cursor, so a rare adapter's page is bounded work."""


def queue_indexed(pipe: Any, keys: RegistryKeys, tenant: str, *users: str) -> None:
    """Queue ``users`` into the index (a new binding)."""
    if users:
        pipe.zadd(keys.user_index(tenant), dict.fromkeys(users, 0))


def queue_unindexed(pipe: Any, keys: RegistryKeys, tenant: str, *users: str) -> None:
    """Queue ``users`` out of the index (their bindings are removed)."""
    if users:
        pipe.zrem(keys.user_index(tenant), *users)


def ensure_index(client: Redis, keys: RegistryKeys, tenant: str) -> None:
    """Add the bindings made before the index existed, once per tenant."""
    if client.exists(keys.user_index_complete(tenant)):
        return
    for name in client.zrange(keys.adapters(tenant), 0, -1):
        batch: list[str] = []
        for user in client.sscan_iter(keys.adapter_users(tenant, name), count=BACKFILL_BATCH):
            batch.append(user)
            if len(batch) >= BACKFILL_BATCH:
                client.zadd(keys.user_index(tenant), dict.fromkeys(batch, 0))
                batch.clear()
        if batch:
            client.zadd(keys.user_index(tenant), dict.fromkeys(batch, 0))
    client.set(keys.user_index_complete(tenant), "1")


def page(
    client: Redis,
    keys: RegistryKeys,
    tenant: str,
    limit: int,
    cursor: str | None,
    adapter: str | None = None,
) -> tuple[list[UserBinding], str | None]:
    """Up to ``limit`` bindings after user id ``cursor`` (all of them, or ``adapter``'s), by
    user id, and the cursor of the next page (None: nothing after). With ``adapter`` a page
    reads at most ``limit x SCAN_FACTOR`` users, so it may hold fewer than ``limit`` (even
    none) and still have a cursor."""
    index = keys.user_index(tenant)
    budget = limit if adapter is None else limit * SCAN_FACTOR
    items: list[UserBinding] = []
    after = cursor
    while budget > 0:
        want = limit - len(items) if adapter is None else min(budget, READ_BATCH)
        users: list[str] = client.zrange(
            index, f"({after}" if after else "-", "+", bylex=True, offset=0, num=want
        )
        if not users:
            return items, None
        bound = client.mget([keys.binding(tenant, u) for u in users])
        stale = [u for u, name in zip(users, bound, strict=True) if name is None]
        if stale:
            client.zrem(index, *stale)
        for user, name in zip(users, bound, strict=True):
            after = user
            if name is not None and (adapter is None or name == adapter):
                items.append(UserBinding(user=user, adapter=name))
                if len(items) == limit:
                    return items, _more_after(client, index, after)
        budget -= len(users)
        if len(users) < want:
            return items, None
    return items, _more_after(client, index, after)


def _more_after(client: Redis, index: str, user: str | None) -> str | None:
    """``user`` as the next page's cursor, or None when no id follows it."""
    if user is None:
        return None
    following = client.zrange(index, f"({user}", "+", bylex=True, offset=0, num=1)
    return user if following else None
