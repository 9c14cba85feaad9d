"""Per tenant and worker: the classic adapters a gateway has requests open to.

A worker runs at most ``--max-loras`` distinct adapters at once, and an adapter applied to
every token (mode ``all``, a classic LoRA) keeps its slot until its request ends; the
worker keeps some slots from classic adapters for prefill-only ones
(:mod:`preft_serve.worker.decode_slots`), but among classic adapters it cannot tell
tenants apart. One tenant's long answers on distinct classic adapters could hold every
classic slot of a worker, and every other tenant's classic adapters there would wait until
they ended. So the gateway routes a tenant's request for a classic adapter only to workers
where that tenant has fewer than ``limit`` other classic adapters open: past it, the
request spills to the next worker of the adapter's order, and where every worker is full,
it is refused (429, ``Retry-After``). More requests for an adapter already open there take
no new slot and pass. Prefill-only and ReFT adapters and the base model are not counted.

The counts are this replica's, like the other per-tenant budgets (``tenant_budgets``).
"""

from __future__ import annotations

from collections import Counter

from preft_serve.common.errors import TooManyRequests
from preft_serve.gateway.tenant_budgets import RETRY_AFTER

ClassicRequest = tuple[str, str]
"""(tenant, adapter key) of a request for a classic adapter."""


class ClassicSlots:
    """Open requests per (worker, tenant) and classic adapter; ``limit`` 0: no limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: dict[tuple[str, str], Counter[str]] = {}

    def full(self, worker: str, request: ClassicRequest) -> bool:
        """Would ``request`` take one more slot than its tenant may hold on ``worker``?"""
        tenant, key = request
        adapters = self.open.get((worker, tenant))
        return bool(self.limit and adapters and key not in adapters and len(adapters) >= self.limit)

    def acquire(self, worker: str, request: ClassicRequest) -> None:
        tenant, key = request
        self.open.setdefault((worker, tenant), Counter())[key] += 1

    def release(self, worker: str, request: ClassicRequest) -> None:
        tenant, key = request
        adapters = self.open.get((worker, tenant))
        if adapters is None:
            return
        adapters[key] -= 1
        if adapters[key] <= 0:
            del adapters[key]
            if not adapters:
                del self.open[(worker, tenant)]

    def refusal(self) -> TooManyRequests:
        """Every worker holds ``limit`` of the tenant's classic adapters already."""
        return TooManyRequests(
            f"{self.limit} of your adapters applied to every token (mode 'all') are already "
            "answering on each worker, the most one tenant may hold there: each keeps a "
            "worker's adapter slot until its answer ends. Retry when some have finished, or "
            "serve the adapter prefill-only (mode 'prefill'), which frees its slot once "
            "the prompt is read",
            code="too_many_classic_adapters",
            headers=RETRY_AFTER,
        )
