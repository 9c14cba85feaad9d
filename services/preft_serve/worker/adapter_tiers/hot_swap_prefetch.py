"""Registry events -> the worker's disk cache: prefetch new versions, demote old ones.

When a tenant publishes a new version of an adapter (``PUT /v1/adapters/{name}``) and this
worker holds an older version of it on disk, the worker was serving that adapter, so the
gateway will keep sending its users here: the new blob is downloaded right away, and the
hot swap's first request finds it on disk instead of waiting for the object store. The old
versions move to the cold end of the LRU (evicted first, unless a request still uses them:
in-flight and pinned requests are never affected, blobs are immutable and content-addressed,
so nothing on disk is ever *wrong*, only no longer wanted).

Runs in the API-server process (where the resolver and its cache live), started with the
resolver's first use; events arrive on the registry client's listener thread and are handed
to a small worker pool so the listener never blocks on a download.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from preft_serve.common.registry_client import EventType, RegistryClient, RegistryEvent
from preft_serve.worker.adapter_tiers.disk_cache import AdapterDiskCache

logger = logging.getLogger(__name__)


class PrefetchMetrics:
    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.prefetches = Counter(
            "preft_worker_adapter_prefetches_total",
            "New adapter versions handled on a registry event: fetched (an older version was "
            "on disk), skipped (none was) or error",
            ["outcome"],
            registry=registry,
        )


class RegistryPrefetcher:
    def __init__(
        self,
        client: RegistryClient,
        cache: AdapterDiskCache,
        metrics: PrefetchMetrics | None = None,
        threads: int = 2,
    ) -> None:
        self.client, self.cache = client, cache
        self.metrics = metrics or PrefetchMetrics(CollectorRegistry())
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="preft-prefetch")
        client.add_listener(self.on_event)

    def on_event(self, event: RegistryEvent) -> None:
        if (
            event.type == EventType.ADAPTER_UPDATED.value
            and event.sha256
            and event.adapter
            and (event.version or 0) > 1
        ):  # a first version replaces nothing
            self._pool.submit(self._handle, event)

    def _handle(self, event: RegistryEvent) -> None:
        assert event.sha256 and event.adapter
        try:
            versions = self.client.redis.hvals(
                self.client.keys.versions(event.tenant, event.adapter)
            )
            older = {json.loads(v)["sha256"] for v in versions} - {event.sha256}
            held = [sha for sha in older if sha in self.cache]
            if not held:
                self.metrics.prefetches.labels("skipped").inc()
                return
            for sha in held:
                self.cache.demote(sha)
            self.cache.get(event.sha256)
            self.metrics.prefetches.labels("fetched").inc()
            logger.info(
                "prefetched %s/%s v%s (%s) replacing %d older version(s) on disk",
                event.tenant,
                event.adapter,
                event.version,
                event.sha256[:12],
                len(held),
            )
        except Exception:  # a prefetch is an optimisation: log, count, go on
            self.metrics.prefetches.labels("error").inc()
            logger.exception("prefetch of %s/%s failed", event.tenant, event.adapter)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
