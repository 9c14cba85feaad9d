"""Zipf popularity over the load test's users (one user per adapter): ``--zipf S``.

User ``i`` of ``n`` is drawn with probability proportional to ``1 / rank(i) ** s``, the
ranks a seeded permutation of ``1..n`` (which adapters are hot does not follow their order
in the plan); ``s = 0`` is uniform. Kept apart from ``locustfile.py``, which imports locust
(and with it gevent's monkey patching), so tests can import it.
"""

from __future__ import annotations

import itertools
import random


def ranks(n: int, seed: int) -> list[int]:
    """Each user's popularity rank, 1 (the most popular) to ``n``."""
    order = list(range(1, n + 1))
    random.Random(seed).shuffle(order)
    return order


def shares(n: int, s: float, seed: int = 0) -> list[float]:
    """Each user's share of the requests."""
    weights = [r**-s for r in ranks(n, seed)]
    total = sum(weights)
    return [w / total for w in weights]


def top_share(n: int, s: float) -> float:
    """The most popular user's share: ``1 / H(n, s)``."""
    return 1.0 / sum(k**-s for k in range(1, n + 1))


class Zipf:
    """Draws user indices ``0..n-1`` with Zipf(``s``) popularity."""

    def __init__(self, n: int, s: float, seed: int) -> None:
        if n < 1 or s < 0:
            raise ValueError("Zipf needs n >= 1 and s >= 0")
        self.n = n
        self.cum = list(itertools.accumulate(shares(n, s, seed)))

    def pick(self, rng: random.Random) -> int:
        return rng.choices(range(self.n), cum_weights=self.cum)[0]
