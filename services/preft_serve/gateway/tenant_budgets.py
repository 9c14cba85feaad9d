"""Per-tenant budgets of a gateway's shared capacity: cold loads and open requests.

Both count, per tenant, requests that hold something every tenant shares, and refuse one
more past the tenant's limit with a 429 that says why and that a retry will do (nothing
was sent to a worker), while other tenants' requests pass untouched:

* **cold loads**: requests sent to a worker that has not reported their adapter loaded, so
  it fetches the adapter from the object store before it can start. A tenant that brings
  thousands of new adapters at once (a launch, a migration) would otherwise take every
  worker's fetch threads and host memory, and the other tenants' time to first token with
  them. Requests to adapters already loaded are not counted.
* **open requests**: requests open to workers (a stream until it ends). The gateway keeps
  at most ``max_open_requests`` open in all (503 ``gateway_busy`` past it); without a
  share, one tenant's long streams (or slow readers) could hold all of them and every
  other tenant would get the 503.

The counts are this replica's (a budget per replica, like the upload limits):
``replicas x limit`` bounds a tenant in the cluster without a shared counter.
"""

from __future__ import annotations

from collections import Counter

from preft_serve.common.errors import TooManyRequests

RETRY_AFTER = {"Retry-After": "1"}


class TenantBudget:
    """Open requests per tenant (one event loop, no locking); ``limit`` 0: none. Past the
    limit, a 429 with ``code`` and ``message`` (``{limit}`` filled in)."""

    def __init__(self, limit: int, code: str, message: str) -> None:
        self.limit, self.code, self.message = limit, code, message
        self.open: Counter[str] = Counter()

    def check(self, tenant: str) -> None:
        """Refuse ``tenant`` when its budget is full, counting nothing: lets a request be
        refused before it spends anything else (its rate-limit tokens)."""
        if self.limit and self.open[tenant] >= self.limit:
            raise TooManyRequests(
                self.message.format(limit=self.limit), code=self.code, headers=RETRY_AFTER
            )

    def acquire(self, tenant: str) -> None:
        """Count one more request of ``tenant``, or refuse it (nothing counted)."""
        self.check(tenant)
        self.open[tenant] += 1

    def release(self, tenant: str) -> None:
        self.open[tenant] -= 1
        if self.open[tenant] <= 0:
            del self.open[tenant]


def cold_loads(limit: int) -> TenantBudget:
    """The cold-load budget: ``limit`` requests a tenant may have waiting on adapter loads."""
    return TenantBudget(
        limit,
        "too_many_cold_loads",
        "{limit} of your requests are already waiting for adapters to be loaded onto a "
        "worker, the most at once; retry shortly (requests to adapters in use are not "
        "limited)",
    )


def open_requests(limit: int) -> TenantBudget:
    """The open-request share: ``limit`` requests a tenant may have open to workers."""
    return TenantBudget(
        limit,
        "too_many_open_requests",
        "{limit} of your requests are already open on this gateway (a stream counts until "
        "it ends), the most one tenant may have at once; retry when some have finished",
    )
