"""Uploads and downloads in progress on this replica, capped per tenant and in all.

An upload holds its multipart spool and staging copy on this replica's scratch disk, and
memory while it is parsed; an adapter download holds the weights and their archive in
staging, and a fine-tuning file's content is held in memory, for as long as the client
takes to read it. Without a cap one tenant, or one slow client, could open enough of them
to fill the disk every other tenant's uploads need (and have the pod evicted). Each tenant
gets at most ``per_tenant`` of them at once (429 with ``Retry-After``), and the replica at
most ``total`` (503 with ``Retry-After``), so one tenant never holds more than its share.

The counts are per replica, like the disk and memory they protect.
"""

from __future__ import annotations

import threading

from preft_serve.common.domain_errors import RateLimited, Unavailable

RETRY_AFTER_S = 1
"""What the refusals' ``Retry-After`` asks for: a transfer in progress usually ends within
seconds, and the client's retry then finds a free slot or is refused again at once."""


class TransferSlots:
    """Counted slots, one per upload or download in progress (threads or event loops may
    take them; the counts are guarded by one lock)."""

    def __init__(self, total: int, per_tenant: int) -> None:
        if not 1 <= per_tenant <= total:
            raise ValueError(f"need 1 <= per_tenant ({per_tenant}) <= total ({total})")
        self.total, self.per_tenant = total, per_tenant
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._in_progress = 0

    @property
    def in_progress(self) -> int:
        return self._in_progress

    def take(self, tenant: str) -> None:
        """One slot of ``tenant``'s, given back with :meth:`give_back`; refused
        (``RateLimited`` for the tenant's own cap, ``Unavailable`` for the replica's) when
        none is free."""
        with self._lock:
            held = self._held.get(tenant, 0)
            if held >= self.per_tenant:
                raise RateLimited(
                    f"this tenant already has {held} uploads or downloads in progress on "
                    f"this registry replica, its limit "
                    f"(PREFT_REGISTRY_TENANT_MAX_TRANSFERS); wait for one to finish, then "
                    f"retry",
                    code="too_many_transfers",
                )
            if self._in_progress >= self.total:
                raise Unavailable(
                    f"this registry replica has {self._in_progress} uploads and downloads "
                    f"in progress, its limit (PREFT_REGISTRY_MAX_TRANSFERS); retry shortly",
                    code="registry_busy",
                )
            self._held[tenant] = held + 1
            self._in_progress += 1

    def give_back(self, tenant: str) -> None:
        with self._lock:
            held = self._held[tenant] - 1
            if held:
                self._held[tenant] = held
            else:
                del self._held[tenant]
            self._in_progress -= 1
