"""Order statistics for the benchmarks' summaries.

A percentile here is always one of the samples (no interpolation), picked by one of three
rank conventions. Each benchmark keeps the convention its committed results were computed
with, so a rerun compares with them number for number:

* ``nearest-rank``: the ⌈q·n⌉-th smallest value (the load test, the gateway benchmarks);
* ``next-rank``: the (⌊q·n⌋ + 1)-th smallest, capped at the largest; one rank above
  ``nearest-rank`` when q·n is whole, e.g. the upper middle value as the p50 of an even
  count (the cold-start and registry benchmarks);
* ``lower``: the (⌊q·(n - 1)⌋ + 1)-th smallest, numpy's ``method="lower"`` (the soak's
  latency bins, the parse-placement experiment).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Literal

Method = Literal["nearest-rank", "next-rank", "lower"]


def percentile(values: Iterable[float], q: float, method: Method = "nearest-rank") -> float | None:
    """The ``q``-th percentile (``q`` in 0..100) of ``values``; None for no values."""
    data = sorted(values)
    n = len(data)
    if not n:
        return None
    if method == "nearest-rank":
        index = max(1, math.ceil(q / 100 * n)) - 1
    elif method == "next-rank":
        index = min(n - 1, int(q / 100 * n))
    elif method == "lower":
        index = int(q / 100 * (n - 1))
    else:
        raise ValueError(f"unknown method {method!r}: nearest-rank, next-rank or lower")
    return data[index]


def median(values: Iterable[float]) -> float:
    """The median as a float (the mean of the middle two for an even count)."""
    return float(statistics.median(list(values)))
