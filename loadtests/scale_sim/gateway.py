"""One simulated gateway replica: the product's own :class:`WorkerPool` (routing: rendezvous
order, bounded-load cap, resident preference, health) and :class:`ResolveCache` (the registry
client's user -> adapter cache), each gateway with its own view: its own in-flight counts,
the resident sets it polled last, the membership it discovered last.

What the gateway does with them mirrors ``gateway/proxy.py:open_upstream`` (try
``choice.order`` in turn; a worker that cannot be reached is marked failed and the next one
is tried; a request that lands anywhere but the first choice counts as a spill) and
``gateway/pool_monitor.py`` (health and ``/v1/models`` every ``health_interval_s``,
membership every ``discovery_interval_s``). Redis commands are counted per kind.
"""

from __future__ import annotations

from collections import Counter

from loadtests.scale_sim.model import GatewayConfig
from loadtests.scale_sim.workload import Population
from preft_serve.common.registry_client import AdapterRef
from preft_serve.common.registry_client.cache import MISSING, ResolveCache
from preft_serve.gateway.routing import WorkerPool


class SimGateway:
    def __init__(self, index: int, config: GatewayConfig, workers: list[str],
                 decode_workers: list[str] | None = None, worker_load: bool = False,
                 hot_replicas: int = 1) -> None:
        """``worker_load``: ``PREFT_GATEWAY_CAP_ON_WORKER_LOAD`` (the cap on the workers'
        own counts, which ``Cluster.poll`` hands to the pools); ``hot_replicas``:
        ``PREFT_GATEWAY_HOT_REPLICAS`` (the decode pool, picked by load alone, has none)."""
        self.index = index
        self.config = config
        self.pool = WorkerPool(workers, load_factor=config.load_factor,
                               unhealthy_after=config.unhealthy_after, worker_load=worker_load,
                               hot_replicas=hot_replicas)
        self.decode_pool = (WorkerPool(decode_workers, load_factor=config.load_factor,
                                       unhealthy_after=config.unhealthy_after,
                                       worker_load=worker_load)
                            if decode_workers else None)
        self.cache = ResolveCache(config.registry_cache_entries)
        self.redis: Counter[str] = Counter()
        self.usage: set[tuple[int, int]] = set()  # (tenant, adapter) counted since the flush

    def resolve(self, pop: Population, user: int) -> tuple[AdapterRef, bool]:
        """The user's adapter through the registry cache; whether the cache answered
        (a miss is one EVALSHA of ``RESOLVE_USER_LUA``)."""
        tenant = f"t{pop.user_tenant[user]}"
        uid = f"u{user}"
        hit = self.cache.get_user(tenant, uid)
        if hit is not MISSING and hit is not None:
            return hit, True
        epoch = self.cache.epoch
        ref = pop.ref(int(pop.user_adapter[user]))
        self.redis["EVALSHA resolve_user"] += 1
        self.cache.put(epoch, tenant, uid, ref.name, ref)
        return ref, False

    def flush_usage(self) -> None:
        """``UsageRecorder.flush``: per (tenant, model) three HINCRBY, per tenant-day key
        one EXPIRE, one pipeline."""
        if self.usage:
            self.redis["HINCRBY usage"] += 3 * len(self.usage)
            self.redis["EXPIRE usage"] += len({tenant for tenant, _ in self.usage})
            self.usage.clear()
