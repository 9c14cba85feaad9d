"""The tenant's bound users in one sorted set, so that listing them reads a page at a time.

Bindings are one key per user plus a set per adapter, which answer "whose adapter?" and
"who is bound to it?" but not "the next 100 users": listing them all read every adapter's
set in one transaction, up to ``TENANT_MAX_USERS`` (100,000) ids in one answer, and a
tenant listing in a loop kept Redis busy for everyone. The index is a sorted set of user
ids, all at score 0, so Redis orders them by id and ``ZRANGE ... BYLEX`` reads the page
after a cursor in O(log n + page).

Every binding write adds its user to the index and every removal takes it out, in the same
transaction (:mod:`preft_serve.registry.bindings`, adapter and tenant deletes). Bindings the
index does not hold (made before it existed, or by a registry of an older version during a
rolling update) are added by :func:`ensure_index`: the first time a tenant's users are
listed, and again (at most every ``RECHECK_S``) whenever the index holds fewer users than
the tenant's count of bound users. An id whose binding is gone (a removal by an older
registry; a backfill that read a user just unbound) is taken out by the page that meets
it, atomically with the check, so it is never listed and a user bound meanwhile stays.
"""

from __future__ import annotations

from typing import Any

from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry.schemas import UserBinding
from preft_serve.registry.txn import Redis

BACKFILL_BATCH = 500
RECHECK_S = 600  # least time between two backfills of one tenant that ran for a shortfall
READ_BATCH = 1000  # index entries a page reads at once with an adapter filter
SCAN_FACTOR = 10
"""A page reads at most this many index entries per item asked for; past that it ends
early with a cursor, so a page of a rare adapter's users (or past many stale entries) is
bounded work."""

# Removes each id (ARGV) whose binding key (KEYS[2..]) does not exist from the index
# (KEYS[1]), checked and removed at once: a user bound between a page's read and this stays.
_DROP_UNBOUND = """
local removed = 0
for i, user in ipairs(ARGV) do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 then
    removed = removed + redis.call('ZREM', KEYS[1], user)
  end
end
return removed
"""


def queue_indexed(pipe: Any, keys: RegistryKeys, tenant: str, *users: str) -> None:
    """Queue ``users`` into the index (a binding written; adding one present is a no-op)."""
    if users:
        pipe.zadd(keys.user_index(tenant), dict.fromkeys(users, 0))


def queue_unindexed(pipe: Any, keys: RegistryKeys, tenant: str, *users: str) -> None:
    """Queue ``users`` out of the index (their bindings are removed)."""
    if users:
        pipe.zrem(keys.user_index(tenant), *users)


def ensure_index(client: Redis, keys: RegistryKeys, tenant: str, now: float) -> None:
    """Add the bindings the index does not hold: once per tenant, and again when it holds
    fewer users than the tenant's count of bound users, at most every ``RECHECK_S`` (a
    count that never matches must not make every listing a backfill). Reads each adapter's
    set a batch at a time (a tenant's 100,000 users: a few hundred round trips, none long)."""
    index, done = keys.user_index(tenant), keys.user_index_complete(tenant)
    pipe = client.pipeline(transaction=False)
    pipe.get(done)
    pipe.zcard(index)
    pipe.get(keys.bound_users(tenant))
    last, indexed, bound = pipe.execute()
    if last is not None and (indexed >= int(bound or 0) or now - float(last) < RECHECK_S):
        return
    for name in client.zrange(keys.adapters(tenant), 0, -1):
        batch: list[str] = []
        for user in client.sscan_iter(keys.adapter_users(tenant, name), count=BACKFILL_BATCH):
            batch.append(user)
            if len(batch) >= BACKFILL_BATCH:
                client.zadd(index, dict.fromkeys(batch, 0))
                batch.clear()
        if batch:
            client.zadd(index, dict.fromkeys(batch, 0))
    if not client.exists(keys.tenant(tenant)):  # deleted meanwhile: leave nothing behind
        client.delete(index, done)
        return
    client.set(done, str(now))  # when it ran


def page(
    client: Redis,
    keys: RegistryKeys,
    tenant: str,
    limit: int,
    cursor: str | None,
    adapter: str | None = None,
) -> tuple[list[UserBinding], str | None]:
    """Up to ``limit`` bindings after user id ``cursor`` (all of them, or ``adapter``'s), by
    user id, and the cursor of the next page (None: nothing after). A page reads at most
    ``limit x SCAN_FACTOR`` index entries, so it may hold fewer than ``limit`` (even none)
    and still have a cursor."""
    index = keys.user_index(tenant)
    budget = limit * SCAN_FACTOR
    items: list[UserBinding] = []
    after = cursor
    while budget > 0:
        want = min(budget, limit - len(items) if adapter is None else READ_BATCH)
        users: list[str] = client.zrange(
            index, f"({after}" if after else "-", "+", bylex=True, offset=0, num=want
        )
        if not users:
            return items, None
        binding_keys = [keys.binding(tenant, u) for u in users]
        bound = client.mget(binding_keys)
        stale = [i for i, name in enumerate(bound) if name is None]
        if stale:
            stale_keys = [binding_keys[i] for i in stale]
            client.eval(
                _DROP_UNBOUND, 1 + len(stale), index, *stale_keys, *(users[i] for i in stale)
            )
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
