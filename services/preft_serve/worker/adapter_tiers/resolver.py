"""Resolves adapter names to directories: the object store through the disk cache.

vLLM's OpenAI server asks every registered LoRA resolver about a ``model`` name it does
not know (only when ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``), then loads the adapter and
remembers it under that name. The gateway sends ``sha256:<hex>``, so a name *is* the
adapter's identity and needs no lookup. Anything else — a path, a URL, a registry name,
uppercase hex — is refused with ``None``, which vLLM answers with a 404: a client can never
make the worker read an arbitrary file or fetch an arbitrary URL. A hash the store does not
hold is also ``None`` (404); a store that cannot be used at all (directory gone, bucket
missing, endpoint down) raises ``StoreUnavailable``, a 503 to retry, never "does not exist".

No vLLM here: :mod:`preft_serve.worker.vllm_compat.lora_resolver` registers this with
vLLM's server, hands vLLM a resolved adapter as its ``LoRARequest`` and an unusable store
as the 503. The resolver only runs in the API-server process, but the plugin registers it
in every vLLM process, so the object store client and the disk cache are built on first
use.

Downloads and hash checks run in a small pool of low-priority threads
(``PREFT_WORKER_RESOLVER_THREADS``), never on the server's event loop: streams keep flowing
while a cold adapter is fetched, a burst of new adapters queues instead of taking every
core from the engine, and the engine's own ``add_lora`` then only registers the adapter
(its weights are parsed in the background, see ``background_parse.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from preft_serve.adapters.format import parse_model_name
from preft_serve.common.objectstore import ObjectNotFound, StoreUnavailable
from preft_serve.common.registry_client import RegistryClient
from preft_serve.worker.adapter_tiers.background_parse import lower_thread_priority
from preft_serve.worker.adapter_tiers.disk_cache import AdapterCacheMetrics, AdapterDiskCache
from preft_serve.worker.adapter_tiers.hot_swap_prefetch import PrefetchMetrics, RegistryPrefetcher
from preft_serve.worker.settings import WorkerSettings

logger = logging.getLogger(__name__)


def lora_int_id(sha256: str) -> int:
    """A positive id that is stable across restarts and processes (60 bits of the hash).

    vLLM's server currently replaces it with its own counter; it matters for callers that
    build requests from this resolver directly (and keeps ids meaningful in logs).
    """
    return int(sha256[:15], 16) + 1


@dataclasses.dataclass(frozen=True)
class ResolvedAdapter:
    """An adapter found under the name a request gave: what the engine loads it by."""

    name: str
    int_id: int
    path: str


class DiskCacheResolver:
    """Resolves ``sha256:<hex>`` names to directories in the local disk cache."""

    def __init__(self, settings: WorkerSettings, cache: AdapterDiskCache | None = None) -> None:
        self.settings = settings
        self._cache = cache
        self._init_lock = threading.Lock()
        self.prefetcher: RegistryPrefetcher | None = None
        self._pool = ThreadPoolExecutor(
            settings.resolver_threads,
            thread_name_prefix="preft-resolve",
            initializer=lower_thread_priority,
        )

    @property
    def cache(self) -> AdapterDiskCache:
        """The disk cache, created on first use (and only in the process that resolves)."""
        if self._cache is None:
            with self._init_lock:
                if self._cache is None:
                    self._cache = AdapterDiskCache(
                        self.settings.create_store(),
                        self.settings.adapter_cache_dir,
                        self.settings.adapter_cache_bytes,
                        metrics=AdapterCacheMetrics(),
                    )
                    self.prefetcher = start_prefetcher(self.settings, self._cache)
        return self._cache

    async def resolve(self, lora_name: str) -> ResolvedAdapter | None:
        """The adapter named ``lora_name``; None when the name is not a hash or the store
        does not hold it. Raises ``StoreUnavailable`` when the store cannot be used."""
        sha256 = parse_model_name(lora_name)
        if sha256 is None:
            return None
        try:
            path = await self._fetch_in_pool(sha256)
        except ObjectNotFound:
            logger.info("adapter %s: not in the object store", sha256)
            return None
        except StoreUnavailable as exc:
            logger.error("adapter %s: object store unavailable: %s", sha256, exc)
            raise
        # Corrupt blobs propagate: vLLM answers 500 with the message, which is the truth
        # (a server-side fault, not an unknown model).
        return ResolvedAdapter(lora_name, lora_int_id(sha256), path)

    async def on_use(self, lora_name: str) -> None:
        """Each request for an adapter vLLM's server already holds under ``lora_name``
        (``vllm_compat.serving.install_adapter_use_hook`` calls this). The server never asks
        the resolver about it again, so without this the disk cache would (a) age a hot
        adapter as if unused and evict it first, and (b) once it is evicted, leave the engine a path
        that no longer exists for its next load from disk (after the adapter leaves host
        memory). A hit costs an in-memory LRU move; an evicted adapter is fetched again
        before the request reaches the engine."""
        sha256 = parse_model_name(lora_name)
        if sha256 is None or self.cache.note_use(sha256):
            return
        try:
            await self._fetch_in_pool(sha256)
        except Exception as exc:  # noqa: BLE001 - the engine reports a load that fails
            logger.warning(
                "adapter %s: evicted from the disk cache and not fetched again "
                "(%s); its requests fail until it is",
                sha256,
                exc,
            )
        else:
            logger.info("adapter %s: fetched again after its disk-cache eviction", sha256)

    async def _fetch_in_pool(self, sha256: str) -> str:
        """The adapter's directory through the disk cache, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, lambda: str(self.cache.get(sha256))
        )


def start_prefetcher(
    settings: WorkerSettings, cache: AdapterDiskCache
) -> RegistryPrefetcher | None:
    """Listen for registry events if ``registry_redis_url`` is set (see ``hot_swap_prefetch``)."""
    if settings.registry_redis_url is None:
        return None
    client = RegistryClient(settings.registry_redis_url, namespace=settings.registry_namespace)
    prefetcher = RegistryPrefetcher(client, cache, PrefetchMetrics())
    try:
        client.start(timeout=5)
    except TimeoutError:
        logger.warning("registry Redis not reachable yet; prefetching starts when it is")
    return prefetcher
