"""A per-tenant budget of cold loads: requests sent to a worker that has not reported their
adapter loaded, so it fetches the adapter from the object store before it can start.

A tenant that brings thousands of new adapters at once (a launch, a migration) would
otherwise take every worker's fetch threads and host memory, and the other tenants' time to
first token with them. Each gateway replica lets one tenant have at most ``limit`` such
requests waiting for their worker to answer at once (the load happens then); more are
refused with a 429 whose message says why and that a retry will do, while the tenant's
requests to adapters already loaded, and other tenants', pass untouched. The count is
this replica's (a budget per replica, like the upload limits): ``replicas x limit`` bounds a
tenant's cold loads in the cluster without a shared counter.
"""

from __future__ import annotations

from collections import Counter

from preft_serve.common.errors import TooManyRequests


class ColdLoads:
    """Open cold requests per tenant (one event loop, no locking); ``limit`` 0: none."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: Counter[str] = Counter()

    def acquire(self, tenant: str) -> None:
        """Count one more cold request of ``tenant``, or refuse it (nothing counted)."""
        if self.limit and self.open[tenant] >= self.limit:
            raise TooManyRequests(
                f"{self.limit} of your requests are already waiting for adapters to be "
                "loaded onto a worker, the most at once; retry shortly (requests to adapters "
                "in use are not limited)",
                code="too_many_cold_loads",
            )
        self.open[tenant] += 1

    def release(self, tenant: str) -> None:
        self.open[tenant] -= 1
        if self.open[tenant] <= 0:
            del self.open[tenant]
