"""Each routing key's share of the recent requests, in bounded memory.

A gateway replica sees a random sample of the users (the Service spreads connections), so
the share of its own requests an adapter takes is the share it takes of the cluster's; the
router replicates an adapter whose share is more than one worker should carry
(:class:`preft_serve.gateway.routing.WorkerPool`).

The share decays per request, not per second: each request weighs ``1 / (1 - 1/window)``
times the one before, so a key's count is its exponentially weighted number of requests over
about the last ``window`` ones and the share does not depend on how busy the gateway is.
Memory is bounded by keeping the ``size`` heaviest keys whenever twice that many are held:
a key that takes a share worth replicating holds many requests' weight, a key seen once
holds one, so pruning drops the tail and never a hot key while fewer than ``size`` keys
are hot. Sketch libraries (DataSketches' frequent items, space-saving counters) count
without decay, and a hot set moves over a day; a dict pruned to its top keys is as small
and decays.
"""

from __future__ import annotations

import heapq

_RESCALE_AT = 1e100  # request weights grow geometrically; scale them back before overflow


class HotKeys:
    """Decayed request counts of the heaviest keys (one event loop, no locking)."""

    def __init__(self, window: int = 4096, size: int = 512) -> None:
        if window < 2 or size < 1:
            raise ValueError("window must be >= 2 and size >= 1")
        self.window = window
        self.size = size
        self._growth = 1.0 / (1.0 - 1.0 / window)
        self._weight = 1.0  # what the next request adds
        self._total = 0.0  # decayed count of every request, the pruned keys' included
        self.counts: dict[str, float] = {}

    def add(self, key: str) -> float:
        """Count one request for ``key``; its share afterwards."""
        self._weight *= self._growth
        self._total += self._weight
        self.counts[key] = self.counts.get(key, 0.0) + self._weight
        if len(self.counts) > 2 * self.size:
            self._prune()
        if self._weight > _RESCALE_AT:
            self._rescale()
        return self.share(key)

    def share(self, key: str) -> float:
        """``key``'s decayed share of the last ~``window`` requests. Before ``window``
        requests have been seen the missing ones count as other keys', so a gateway that
        has just started under-estimates a share rather than replicating everything."""
        count = self.counts.get(key)
        if count is None:
            return 0.0
        return count / max(self._total, self._weight * self.window)

    def _prune(self) -> None:
        keep = heapq.nlargest(self.size, self.counts.items(), key=lambda item: item[1])
        self.counts = dict(keep)

    def _rescale(self) -> None:
        scale = 1.0 / self._weight
        self._weight = 1.0
        self._total *= scale
        self.counts = {key: count * scale for key, count in self.counts.items()}
