"""User -> adapter bindings (the logic behind /v1/users).

A binding names an adapter, not a version, so a hot swap (new version) moves every bound
user at once. Each binding is its own key, so binding different users never contends;
the per-adapter user set lets deletion find (and refuse, or remove) bindings.
"""

from __future__ import annotations

import time
from typing import Any

from preft_serve.common.domain_errors import NotFound, QuotaExceeded
from preft_serve.common.registry_client import (
    AdapterRef,
    EventType,
    RegistryClient,
    RegistryEvent,
    RegistryKeys,
)
from preft_serve.common.text import shown
from preft_serve.common.version_split import pick
from preft_serve.registry.events import queue_event
from preft_serve.registry.names import (
    check_adapter_name,
    check_bindable_user_id,
    check_user_id,
)
from preft_serve.registry.schemas import BindingOut, UserBinding
from preft_serve.registry.txn import Redis, transact
from preft_serve.registry.user_index import ensure_index, page, queue_indexed, queue_unindexed


def queue_binding(
    pipe: Any,
    keys: RegistryKeys,
    tenant: str,
    user: str,
    adapter: str,
    old: str | None,
    maxlen: int,
) -> None:
    """Queue the writes of one (re)binding plus its event (shared with the benchmark); a
    new user counts toward the tenant's bound users."""
    pipe.set(keys.binding(tenant, user), adapter)
    if old:
        pipe.srem(keys.adapter_users(tenant, old), user)
    else:
        pipe.incr(keys.bound_users(tenant))
    queue_indexed(pipe, keys, tenant, user)  # a rebind too: it repairs a lost entry
    pipe.sadd(keys.adapter_users(tenant, adapter), user)
    queue_event(
        pipe,
        keys,
        RegistryEvent(EventType.BINDING_UPDATED.value, tenant, adapter=adapter, user=user),
        maxlen,
    )


def _out(user: str, ref: AdapterRef) -> BindingOut:
    """The version this user is served: under a canary split, the user's side of it (the
    gateway's own pick, ``common.version_split``)."""
    served, variant = pick(ref, user)
    return BindingOut(
        user=user,
        adapter=served.name,
        version=served.version,
        sha256=served.sha256,
        type=served.type,
        mode=served.mode,
        variant=variant.value,
    )


def uncount_users(pipe: Any, count_key: str, bound: int, removed: int) -> None:
    """Queue the count of bound users lowered by ``removed`` (``bound`` read under WATCH),
    never below zero: bindings made before the count existed were never counted."""
    if bound:
        pipe.set(count_key, max(0, bound - removed))


class BindingService:
    """Users bound to adapters. A tenant binds at most ``max_users`` users: every binding
    is a few Redis keys, and Redis (``noeviction``) refuses every tenant's writes once it
    is full, so one tenant binding random user ids in a loop must hit its own limit
    first. The count is a counter kept in the same transactions as the bindings."""

    def __init__(
        self, client: Redis, keys: RegistryKeys, events_maxlen: int, max_users: int = 100_000
    ) -> None:
        self.redis = client
        self.keys = keys
        self.maxlen = events_maxlen
        self.max_users = max_users
        # The same read path the gateway uses, without a cache (reads here must be fresh).
        self.reader = RegistryClient(client=client, namespace=keys.ns, cache=False)

    def bind(self, tenant: str, user: str, adapter: str) -> BindingOut:
        check_bindable_user_id(user)
        check_adapter_name(adapter)
        k = self.keys
        binding_key, adapter_key = k.binding(tenant, user), k.adapter(tenant, adapter)
        count_key = k.bound_users(tenant)

        def txn(pipe: Any) -> None:
            if not pipe.exists(adapter_key):
                raise NotFound(f"adapter {shown(adapter)} does not exist; upload it first")
            old = pipe.get(binding_key)
            if old == adapter:
                return
            if old is None and (bound := int(pipe.get(count_key) or 0)) >= self.max_users:
                raise QuotaExceeded(
                    f"this tenant already has {bound} bound users, its limit "
                    f"(PREFT_REGISTRY_TENANT_MAX_USERS); unbind users it no longer serves "
                    f"(DELETE /v1/users/{{user_id}}) or rebind existing ones",
                    param="user_id",
                )
            pipe.multi()
            queue_binding(pipe, k, tenant, user, adapter, old, self.maxlen)

        transact(self.redis, txn, binding_key, adapter_key, count_key)
        return self.get(tenant, user)

    def get(self, tenant: str, user: str) -> BindingOut:
        check_user_id(user)
        ref = self.reader.resolve_user(tenant, user)
        if ref is None:
            raise NotFound(f"user {shown(user)} is not bound to an adapter")
        return _out(user, ref)

    def unbind(self, tenant: str, user: str) -> None:
        check_user_id(user)
        k = self.keys
        binding_key, count_key = k.binding(tenant, user), k.bound_users(tenant)

        def txn(pipe: Any) -> None:
            old = pipe.get(binding_key)
            if old is None:
                raise NotFound(f"user {shown(user)} is not bound to an adapter")
            bound = int(pipe.get(count_key) or 0)
            pipe.multi()
            pipe.delete(binding_key)
            pipe.srem(k.adapter_users(tenant, old), user)
            queue_unindexed(pipe, k, tenant, user)
            uncount_users(pipe, count_key, bound, 1)
            queue_event(
                pipe,
                k,
                RegistryEvent(EventType.BINDING_DELETED.value, tenant, adapter=old, user=user),
                self.maxlen,
            )

        transact(self.redis, txn, binding_key, count_key)

    def list(
        self, tenant: str, limit: int, cursor: str | None = None, adapter: str | None = None
    ) -> tuple[list[UserBinding], str | None]:
        """A page of the tenant's bound users, or of one adapter's, by user id, and the
        next page's cursor (``user_index``)."""
        if cursor is not None:
            check_user_id(cursor)
        if adapter is not None:
            check_adapter_name(adapter)
            if not self.redis.exists(self.keys.adapter(tenant, adapter)):
                raise NotFound(f"adapter {shown(adapter)} does not exist")
        ensure_index(self.redis, self.keys, tenant, time.time())
        return page(self.redis, self.keys, tenant, limit, cursor, adapter)
