"""Which worker serves a request: rendezvous hashing with a bounded-load cap.

Rendezvous (highest-random-weight) hashing on the adapter's sha gives each adapter a stable
preference order over the workers, so one adapter's requests land on the worker that already
has it loaded (affinity), and adding or removing a worker only moves the adapters whose top
choice changed. A hot adapter must not melt its favourite worker, so the gateway counts its
own in-flight requests per worker and skips a worker whose count is at the cap
``ceil(avg * load_factor) + 1`` (avg = in-flight per worker, this request included); taking
the next worker in the adapter's order is a "spill".
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass


def rendezvous_order(key: str, workers: Sequence[str]) -> list[str]:
    """Workers sorted by descending hash(key, worker): stable for a key, uniform over keys."""

    def weight(worker: str) -> bytes:
        return hashlib.blake2b(f"{key}\0{worker}".encode(), digest_size=8).digest()

    return sorted(workers, key=weight, reverse=True)


@dataclass(frozen=True)
class Choice:
    """The order to try workers in, and whether the first is the key's own top choice."""

    order: list[str]
    preferred: str  # the key's rendezvous top choice

    @property
    def spilled(self) -> bool:
        return self.order[0] != self.preferred


class WorkerPool:
    """A static worker list plus the gateway's in-flight count per worker (one event loop)."""

    def __init__(self, workers: Sequence[str], load_factor: float = 1.25) -> None:
        if not workers:
            raise ValueError("at least one worker is needed")
        self.workers = list(dict.fromkeys(workers))
        self.load_factor = load_factor
        self.inflight: dict[str, int] = dict.fromkeys(self.workers, 0)

    def cap(self) -> int:
        """Most in-flight requests one worker may hold before new ones spill."""
        avg = (sum(self.inflight.values()) + 1) / len(self.workers)
        return math.ceil(avg * self.load_factor) + 1

    def choose(self, key: str) -> Choice:
        """Rendezvous order, with the first worker under the cap moved to the front."""
        order = rendezvous_order(key, self.workers)
        cap = self.cap()
        for index, worker in enumerate(order):
            if self.inflight[worker] < cap:
                return Choice([worker, *order[:index], *order[index + 1:]], order[0])
        return Choice(order, order[0])  # unreachable: someone is always under the cap

    def acquire(self, worker: str) -> None:
        self.inflight[worker] += 1

    def release(self, worker: str) -> None:
        self.inflight[worker] -= 1

    @contextmanager
    def track(self, worker: str) -> Iterator[None]:
        """Count a request as in flight on ``worker`` for the duration of the block."""
        self.acquire(worker)
        try:
            yield
        finally:
            self.release(worker)
