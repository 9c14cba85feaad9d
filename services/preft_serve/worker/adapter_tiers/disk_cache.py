"""Size-bounded local disk LRU of adapter directories, keyed by content hash.

Layout: ``<cache_dir>/<sha256>/adapter_config.json + adapter_model.safetensors``, the
directory vLLM is given as ``lora_path``. Why it looks the way it does:

* **Atomic entries.** A download goes to ``<cache_dir>/.tmp-<sha>-<random>/`` through
  :meth:`ObjectStore.fetch_adapter` (which re-hashes the files) and is renamed into place
  only after it verified, so a ``<sha256>`` directory is always complete and correct; a
  corrupt blob raises :class:`BlobIntegrityError` and leaves nothing behind.
* **One download per hash.** Concurrent requests for one hash wait on a per-hash lock and
  the later ones find the entry present (a hit); different hashes download in parallel.
* **LRU by bytes.** Each hit moves the entry to the young end (and touches the directory's
  mtime, so the order survives a restart). Eviction runs after each insert, oldest first,
  and skips hashes with a load in flight; an entry is renamed to ``.evict-*`` under the lock
  and deleted outside it, so readers never see half a directory.
* **Restart-safe.** The index is rebuilt from the directories on disk (oldest mtime first);
  leftover ``.tmp-*`` / ``.evict-*`` directories of a crashed process are deleted.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE, is_digest
from preft_serve.common.objectstore import (
    BlobIntegrityError,
    ObjectNotFound,
    ObjectStore,
)

logger = logging.getLogger(__name__)

TIER = "disk"
_TMP_PREFIX = ".tmp-"
_EVICT_PREFIX = ".evict-"
_LOAD_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class AdapterCacheMetrics:
    """Prometheus series of the adapter tiers (labelled ``tier``; this module uses "disk").

    The defaults register on prometheus-client's global registry, which vLLM's ``/metrics``
    endpoint serves; tests pass their own :class:`CollectorRegistry`.
    """

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.registry = registry
        self.loads = Counter(
            "preft_worker_adapter_loads_total",
            "Adapter load requests by tier and outcome (hit, miss, not_found, corrupt, error)",
            ["tier", "outcome"],
            registry=registry,
        )
        self.load_seconds = Histogram(
            "preft_worker_adapter_load_seconds",
            "Time to make an adapter available in a tier (hits and downloads)",
            ["tier"],
            registry=registry,
            buckets=_LOAD_BUCKETS,
        )
        self.resident = Gauge(
            "preft_worker_resident_adapters",
            "Adapters resident in a tier",
            ["tier"],
            registry=registry,
        )
        self.resident_bytes = Gauge(
            "preft_worker_resident_adapter_bytes",
            "Bytes of adapters resident in a tier",
            ["tier"],
            registry=registry,
        )
        self.evictions = Counter(
            "preft_worker_adapter_evictions_total",
            "Adapters evicted from a tier",
            ["tier"],
            registry=registry,
        )
        self.download_bytes = Counter(
            "preft_worker_adapter_download_bytes_total",
            "Adapter bytes downloaded from the object store",
            registry=registry,
        )


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


class AdapterDiskCache:
    """Adapter directories by sha256, fetched on demand from an :class:`ObjectStore`.

    Thread-safe; :meth:`get` blocks (call it through ``asyncio.to_thread`` from async code).
    ``max_bytes`` is a soft bound: an entry larger than the budget, or entries pinned by
    in-flight loads, stay until they can be evicted.
    """

    def __init__(
        self,
        store: ObjectStore,
        cache_dir: str | Path,
        max_bytes: int,
        *,
        metrics: AdapterCacheMetrics | None = None,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive (got {max_bytes})")
        self.store = store
        self.cache_dir = Path(cache_dir).expanduser().resolve()
        self.max_bytes = max_bytes
        self.metrics = metrics or AdapterCacheMetrics(CollectorRegistry())
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._bytes = 0
        self._pins: collections.Counter[str] = collections.Counter()
        self._sha_locks: dict[str, threading.Lock] = {}
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._rebuild()

    # -- public ---------------------------------------------------------------------------

    def path(self, sha256: str) -> Path:
        """Where the adapter ``sha256`` lives (or would live) in the cache."""
        if not is_digest(sha256):
            raise ValueError(f"not a lowercase hex sha256: {sha256!r}")
        return self.cache_dir / sha256

    def __contains__(self, sha256: str) -> bool:
        with self._lock:
            return sha256 in self._entries

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def lru_order(self) -> list[str]:
        """Cached hashes, least recently used first."""
        with self._lock:
            return list(self._entries)

    def demote(self, sha256: str) -> None:
        """Make ``sha256`` the next to evict (it stays usable until then)."""
        with self._lock:
            if sha256 not in self._entries:
                return
            self._entries.move_to_end(sha256, last=False)
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.path(sha256), (0, 0))  # the order survives a restart (mtime LRU)

    def note_use(self, sha256: str) -> bool:
        """A request for an adapter the server already holds (it asks no resolver for
        those): make it the most recent entry, in memory only (no disk write per
        request). False when it is not cached (evicted, or its directory removed behind
        our back): :meth:`get` fetches it again."""
        dest = self.path(sha256)
        with self._lock:
            if sha256 not in self._entries:
                return False
            if not dest.is_dir():
                self._forget(sha256)
                return False
            self._entries.move_to_end(sha256)
            return True

    def get(self, sha256: str) -> Path:
        """The verified adapter directory for ``sha256``, downloading it on a miss.

        Raises :class:`ObjectNotFound` if the store has no such adapter,
        :class:`BlobIntegrityError` if the stored blob does not hash to ``sha256``, and
        :class:`ObjectStoreError` if the store fails; nothing is cached in those cases.
        """
        dest = self.path(sha256)
        start = time.perf_counter()
        with self._lock:
            self._pins[sha256] += 1
            sha_lock = self._sha_locks.setdefault(sha256, threading.Lock())
        try:
            with sha_lock:
                if self._touch_if_cached(sha256, dest):
                    self._record(start, "hit")
                    return dest
                self._download(sha256, dest, start)
                return dest
        finally:
            with self._lock:
                self._pins[sha256] -= 1
                if self._pins[sha256] <= 0:
                    del self._pins[sha256]
                    self._sha_locks.pop(sha256, None)

    # -- internals ------------------------------------------------------------------------

    def _touch_if_cached(self, sha256: str, dest: Path) -> bool:
        with self._lock:
            if sha256 not in self._entries:
                return False
            self._entries.move_to_end(sha256)
        try:
            os.utime(dest)  # persists the LRU order for the next start
        except FileNotFoundError:  # removed behind our back: forget it and re-download
            with self._lock:
                self._forget(sha256)
            return False
        return True

    def _forget(self, sha256: str) -> None:
        """Drop an entry whose directory is gone (caller holds the lock)."""
        self._bytes -= self._entries.pop(sha256, 0)

    def _download(self, sha256: str, dest: Path, start: float) -> None:
        tmp = self.cache_dir / f"{_TMP_PREFIX}{sha256}-{uuid.uuid4().hex[:8]}"
        try:
            self.store.fetch_adapter(sha256, tmp)
            size = _dir_bytes(tmp)
            if dest.exists():  # a stale, unindexed directory (e.g. created by hand)
                shutil.rmtree(dest)
            os.rename(tmp, dest)
        except ObjectNotFound:
            self._record(start, "not_found", failed=True)
            raise
        except BlobIntegrityError:
            self._record(start, "corrupt", failed=True)
            logger.error("adapter %s: object store blob is corrupt; not cached", sha256)
            raise
        except BaseException:
            self._record(start, "error", failed=True)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        with self._lock:
            self._entries[sha256] = size
            self._bytes += size
        self.metrics.download_bytes.inc(size)
        self._record(start, "miss")
        logger.info("adapter %s: downloaded %d bytes into the disk cache", sha256, size)
        self._evict()

    def _record(self, start: float, outcome: str, failed: bool = False) -> None:
        elapsed = time.perf_counter() - start
        self.metrics.loads.labels(TIER, outcome).inc()
        if not failed:
            self.metrics.load_seconds.labels(TIER).observe(elapsed)
        self._publish_size()

    def _publish_size(self) -> None:
        with self._lock:
            count, size = len(self._entries), self._bytes
        self.metrics.resident.labels(TIER).set(count)
        self.metrics.resident_bytes.labels(TIER).set(size)

    def _evict(self) -> None:
        doomed: list[Path] = []
        with self._lock:
            for sha256 in list(self._entries):
                if self._bytes <= self.max_bytes:
                    break
                if self._pins.get(sha256):
                    continue  # a load is using it right now
                size = self._entries.pop(sha256)
                self._bytes -= size
                grave = self.cache_dir / f"{_EVICT_PREFIX}{sha256}-{uuid.uuid4().hex[:8]}"
                try:
                    os.rename(self.cache_dir / sha256, grave)
                    doomed.append(grave)
                except FileNotFoundError:
                    pass
                self.metrics.evictions.labels(TIER).inc()
                logger.info("adapter %s: evicted from the disk cache (%d bytes)", sha256, size)
        for grave in doomed:
            shutil.rmtree(grave, ignore_errors=True)
        self._publish_size()

    def _rebuild(self) -> None:
        found: list[tuple[float, str, int]] = []
        for child in self.cache_dir.iterdir():
            if child.name.startswith((_TMP_PREFIX, _EVICT_PREFIX)):
                shutil.rmtree(child, ignore_errors=True)  # a crashed download or eviction
                continue
            if not (child.is_dir() and is_digest(child.name)):
                continue
            if not all((child / f).is_file() for f in (CONFIG_FILE, WEIGHTS_FILE)):
                shutil.rmtree(child, ignore_errors=True)  # cannot happen via rename; be safe
                continue
            found.append((child.stat().st_mtime, child.name, _dir_bytes(child)))
        with self._lock:
            for _, sha256, size in sorted(found):
                self._entries[sha256] = size
                self._bytes += size
        if found:
            logger.info(
                "adapter disk cache %s: %d adapters, %d bytes on disk",
                self.cache_dir,
                len(found),
                self._bytes,
            )
        self._evict()
