"""One simulated gateway replica: the product's own :class:`WorkerPool` (routing: rendezvous
order, bounded-load cap, hot replicas, resident preference, health, the open-request limit),
built by ``pool_from_settings`` from :class:`GatewaySettings` as the app builds it, the
product's ``select_target`` (which adapter and routing key a request gets) and its
:class:`ResolveCache` (the registry client's user -> adapter cache), each gateway with its
own view: its own in-flight counts, the loads and resident sets it polled last, the
membership it discovered last.

The routing decision is the product's ``gateway/proxy.py:take_route``, the one
``open_upstream`` makes; what follows mirrors ``open_upstream`` (try ``choice.order`` in
turn; a worker that cannot be reached is marked failed and the next one is tried, one that
answers is marked ok; ``Choice.landed`` says how it was routed) and
``gateway/pool_monitor.py`` (health and ``/v1/models`` every ``health_interval_s``, the
workers' load every ``load_poll_interval_s``, membership every ``discovery_interval_s``).
Redis commands are counted per kind.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

from bench.scale_sim.workload import Population
from preft_serve.common.registry_client import AdapterRef
from preft_serve.common.registry_client.cache import MISSING, ResolveCache
from preft_serve.gateway.routing import pool_from_settings
from preft_serve.gateway.selection import Target, select_target
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.gateway.usage import UsageRecorder

T = TypeVar("T")
BASE_MODEL = "base"
# UsageRecorder's flush period (a constructor default, not a setting).
USAGE_FLUSH_S: float = inspect.signature(UsageRecorder).parameters["flush_interval_s"].default


def product_settings(**changes: Any) -> GatewaySettings:
    """The gateway's settings at their defaults (what the chart deploys unless it overrides
    one; ``tests/bench`` holds the two together), with ``changes``. Built without the
    environment, so a run does not depend on the shell it starts in."""
    return GatewaySettings.model_construct().model_copy(update=changes)


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (the product's async code over the
    simulator's in-memory registry), without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("the coroutine waited on I/O the simulator does not have")


class SimGateway:
    def __init__(
        self,
        index: int,
        settings: GatewaySettings,
        workers: list[str],
        pop: Population,
        decode_workers: list[str] | None = None,
    ) -> None:
        self.index = index
        self.settings = settings
        self.pop = pop
        self.pool = pool_from_settings(settings, workers)
        self.decode_pool = (
            pool_from_settings(settings, decode_workers, decode=True) if decode_workers else None
        )
        self.cache = ResolveCache(settings.registry_cache_entries)
        self.redis: Counter[str] = Counter()
        self.usage: set[tuple[int, int]] = set()  # (tenant, adapter) counted since the flush
        self.hit = False  # whether the last lookup was answered by the cache

    # -- the registry, as select_target's resolver ----------------------------------------

    async def resolve_user(self, tenant: str, user: str) -> AdapterRef | None:
        """The user's adapter through the registry cache (a miss is one EVALSHA of
        ``RESOLVE_USER_LUA``)."""
        hit = self.cache.get_user(tenant, user)
        if hit is not MISSING and hit is not None:
            self.hit = True
            return hit
        self.hit = False
        epoch = self.cache.epoch
        ref = self.pop.ref(int(self.pop.user_adapter[int(user[1:])]))
        self.redis["EVALSHA resolve_user"] += 1
        self.cache.put(epoch, tenant, user, ref.name, ref)
        return ref

    async def resolve_adapter(self, tenant: str, name: str) -> AdapterRef | None:
        return None  # clients here name no adapter: each request runs its user's binding

    def target(self, user: int) -> Target:
        """``select_target`` for a request without ``model``: the user's binding."""
        tenant = f"t{self.pop.user_tenant[user]}"
        return run_now(
            select_target(
                self, tenant, None, f"u{user}", base_name=BASE_MODEL, worker_base_model=BASE_MODEL
            )
        )

    def flush_usage(self) -> None:
        """``UsageRecorder.flush``: per (tenant, model) three HINCRBY, per tenant-day key
        one EXPIRE, one pipeline."""
        if self.usage:
            self.redis["HINCRBY usage"] += 3 * len(self.usage)
            self.redis["EXPIRE usage"] += len({tenant for tenant, _ in self.usage})
            self.usage.clear()
