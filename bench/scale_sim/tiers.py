"""A worker's adapter tiers: GPU slots, host memory, local disk, and what the worker reports.

The classes that keep these in the product need a filesystem, vLLM or threads, so their
policies are mirrored here, each naming what it mirrors (``tests/bench/test_scale_sim.py``
drives the product's :class:`AdapterDiskCache` and this one with the same sequence and checks
they evict the same adapters in the same order):

* slots: vLLM's ``LRUCacheLoRAModelManager`` (``max_loras`` adapters, LRU);
* host memory: vLLM's ``LRUCacheWorkerLoRAManager`` (``max_cpu_loras`` adapters, LRU), which
  also holds every adapter in a slot;
* disk: :class:`preft_serve.worker.adapter_tiers.disk_cache.AdapterDiskCache` (LRU by bytes,
  a hit moves an entry to the young end, eviction oldest first after each insert,
  ``demote`` moves an entry to the old end);
* reported: vLLM's ``OpenAIServingModels.lora_requests``, which ``/v1/models`` lists and the
  gateway polls as the worker's resident set: every adapter the server resolved since it
  started. Nothing in vLLM or the plugin removes a name from it when a tier evicts it.
"""

from __future__ import annotations

from collections import OrderedDict


class _Recency:
    """Adapter shas oldest first, with a size each (what the bounded tiers share)."""

    def __init__(self) -> None:
        self.entries: OrderedDict[str, int] = OrderedDict()

    def __contains__(self, sha: str) -> bool:
        return sha in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def touch(self, sha: str) -> bool:
        """A use: most recent if present; whether it was."""
        if sha in self.entries:
            self.entries.move_to_end(sha)
            return True
        return False


class LruTier(_Recency):
    """Count-bounded LRU of adapter shas (vLLM's slot and host caches)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def add(self, sha: str) -> list[str]:
        """Insert (most recent); returns what was evicted."""
        self.entries[sha] = 1
        self.entries.move_to_end(sha)
        evicted = []
        while len(self.entries) > self.capacity:
            evicted.append(self.entries.popitem(last=False)[0])
        return evicted


class DiskTier(_Recency):
    """Bytes-bounded LRU mirroring ``AdapterDiskCache`` (no pins: a simulated download is
    inserted whole at once, so no load is ever in flight during an eviction)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__()
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evictions = 0

    # ``AdapterDiskCache.note_use`` / a ``get`` hit: move to the young end.
    note_use = _Recency.touch

    def demote(self, sha: str) -> None:
        """``AdapterDiskCache.demote``: next to evict."""
        if sha in self.entries:
            self.entries.move_to_end(sha, last=False)

    def insert(self, sha: str, size: int) -> list[str]:
        """A finished download (``_download``), then ``_evict``: oldest first until the
        total fits."""
        if sha in self.entries:
            self.entries.move_to_end(sha)
            return []
        self.entries[sha] = size
        self.bytes += size
        evicted = []
        while self.bytes > self.max_bytes and self.entries:
            old, freed = self.entries.popitem(last=False)
            self.bytes -= freed
            evicted.append(old)
        self.evictions += len(evicted)
        return evicted


class Reported:
    """The names ``/v1/models`` lists (``lora_requests``), with a frozen snapshot rebuilt
    only after a change, so every gateway polling the worker shares one object."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self._snapshot: frozenset[str] = frozenset()
        self._dirty = False

    def add(self, sha: str) -> None:
        if sha not in self.names:
            self.names.add(sha)
            self._dirty = True

    def snapshot(self) -> frozenset[str]:
        if self._dirty:
            self._snapshot = frozenset(self.names)
            self._dirty = False
        return self._snapshot
