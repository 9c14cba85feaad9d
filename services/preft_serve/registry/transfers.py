"""Uploads and downloads in progress on this replica: slots and scratch bytes, capped per
tenant and in all.

An upload holds its multipart spool and staging copy on this replica's scratch disk, and
memory while it is parsed; an adapter download holds the weights and their archive in
staging, and a fine-tuning file's content is held in memory, for as long as the client
takes to read it. Without a cap one tenant, or one slow client, could open enough of them
to fill the disk every other tenant's uploads need (and have the pod evicted: Kubernetes
evicts a pod whose ``emptyDir`` passes its ``sizeLimit``, it does not answer "disk full").

So each transfer takes a slot (``per_tenant`` a tenant at once, 429 with ``Retry-After``;
``total`` on the replica, 503 with ``Retry-After``), and counts the scratch bytes it
writes as it writes them (:func:`hold_scratch`): a tenant's transfers hold at most
``tenant_scratch_bytes`` at once (429), the replica's ``scratch_bytes`` (503). A slot count
alone does not bound the disk: a gzip archive of a few megabytes may unpack to the weights
limit, and a download stages twice the adapter's size.

The transfer a piece of code runs for is a context variable set by the transfer gate
(``transfer_gate``), so the writers deep in the upload pipeline count their bytes without
each layer passing the transfer down; code that runs for no transfer (a fine-tuning job's
registration) counts nothing. The counts are per replica, like the disk and memory they
protect.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar, Token

from preft_serve.common.domain_errors import RateLimited, Unavailable

RETRY_AFTER_S = 1
"""What the refusals' ``Retry-After`` asks for: a transfer in progress usually ends within
seconds, and the client's retry then finds a free slot or is refused again at once."""

EXPORT_SLACK_BYTES = 1 << 20
"""Scratch a download holds beyond the version's ``size_bytes``, for each of its two
copies: the archive's headers and gzip framing (gzip adds ~0.03% to incompressible
weights), and the config that versions recorded before configs were counted leave out."""

_current: ContextVar[Transfer | None] = ContextVar("preft_registry_transfer", default=None)


def hold_scratch(size: int) -> None:
    """Count ``size`` more bytes of scratch disk against the transfer this code runs for,
    before writing them; refused (``RateLimited``, ``Unavailable``) past the tenant's or
    the replica's scratch limit. Outside a transfer it counts nothing."""
    transfer = _current.get()
    if transfer is not None:
        transfer.hold(size)


class Transfer:
    """One upload or download in progress: its slot and the scratch bytes it holds, all
    given back by :meth:`end`."""

    def __init__(self, slots: TransferSlots, tenant: str) -> None:
        self._slots, self.tenant = slots, tenant
        self.held_bytes = 0
        self.ended = False
        self._token: Token[Transfer | None] | None = None

    def hold(self, size: int) -> None:
        self._slots._hold(self, size)

    def __enter__(self) -> Transfer:
        """Make this the transfer :func:`hold_scratch` counts against."""
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _current.reset(self._token)
        self.end()

    def end(self) -> None:
        """Give the slot and the bytes back (once; later calls do nothing)."""
        if not self.ended:
            self.ended = True
            self._slots._end(self)


class TransferSlots:
    """Counted slots and scratch bytes, per tenant and in all (threads and event loops
    take them; the counts are guarded by one lock)."""

    def __init__(
        self,
        total: int,
        per_tenant: int,
        scratch_bytes: int | None = None,
        tenant_scratch_bytes: int | None = None,
    ) -> None:
        if not 1 <= per_tenant <= total:
            raise ValueError(f"need 1 <= per_tenant ({per_tenant}) <= total ({total})")
        self.scratch_bytes = scratch_bytes
        self.tenant_scratch_bytes = tenant_scratch_bytes or scratch_bytes
        if (
            self.scratch_bytes is not None
            and self.tenant_scratch_bytes is not None
            and not 0 < self.tenant_scratch_bytes <= self.scratch_bytes
        ):
            raise ValueError(
                f"need 0 < tenant_scratch_bytes ({tenant_scratch_bytes}) <= scratch_bytes "
                f"({scratch_bytes})"
            )
        self.total, self.per_tenant = total, per_tenant
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._held_bytes: dict[str, int] = {}
        self._in_progress = 0
        self._scratch_held = 0

    @property
    def in_progress(self) -> int:
        return self._in_progress

    @property
    def scratch_held(self) -> int:
        """Scratch bytes the transfers in progress have counted."""
        return self._scratch_held

    def take(self, tenant: str) -> Transfer:
        """One slot of ``tenant``'s, given back with the transfer's ``end`` (or by leaving
        its ``with`` block); refused (``RateLimited`` for the tenant's own cap,
        ``Unavailable`` for the replica's) when none is free."""
        with self._lock:
            held = self._held.get(tenant, 0)
            if held >= self.per_tenant:
                raise RateLimited(
                    f"this tenant already has {held} uploads or downloads in progress on "
                    f"this registry replica, its limit "
                    f"(PREFT_REGISTRY_TENANT_MAX_TRANSFERS); wait for one to finish, then "
                    f"retry",
                    code="too_many_transfers",
                    retry_after_s=RETRY_AFTER_S,
                )
            if self._in_progress >= self.total:
                raise Unavailable(
                    f"this registry replica has {self._in_progress} uploads and downloads "
                    f"in progress, its limit (PREFT_REGISTRY_MAX_TRANSFERS); retry shortly",
                    code="registry_busy",
                    retry_after_s=RETRY_AFTER_S,
                )
            self._held[tenant] = held + 1
            self._in_progress += 1
        return Transfer(self, tenant)

    def _hold(self, transfer: Transfer, size: int) -> None:
        tenant = transfer.tenant
        with self._lock:
            if transfer.ended:  # its bytes were given back: nothing would give these back
                return
            tenant_bytes = self._held_bytes.get(tenant, 0) + size
            if self.tenant_scratch_bytes is not None and tenant_bytes > self.tenant_scratch_bytes:
                raise RateLimited(
                    f"this tenant's uploads and downloads in progress on this registry "
                    f"replica would hold {tenant_bytes} bytes of scratch disk, past its "
                    f"{self.tenant_scratch_bytes}-byte share "
                    f"(PREFT_REGISTRY_TENANT_SCRATCH_BYTES); wait for the others to "
                    f"finish, then retry",
                    code="too_many_transfers",
                    retry_after_s=RETRY_AFTER_S,
                )
            total_bytes = self._scratch_held + size
            if self.scratch_bytes is not None and total_bytes > self.scratch_bytes:
                raise Unavailable(
                    f"this registry replica's uploads and downloads in progress hold "
                    f"{self._scratch_held} bytes of scratch disk; {size} more would pass "
                    f"its {self.scratch_bytes}-byte limit (PREFT_REGISTRY_SCRATCH_BYTES); "
                    f"retry shortly",
                    code="registry_busy",
                    retry_after_s=RETRY_AFTER_S,
                )
            self._held_bytes[tenant] = tenant_bytes
            self._scratch_held = total_bytes
            transfer.held_bytes += size

    def _end(self, transfer: Transfer) -> None:
        tenant = transfer.tenant
        with self._lock:
            held = self._held[tenant] - 1
            if held:
                self._held[tenant] = held
            else:
                del self._held[tenant]
            self._in_progress -= 1
            held_bytes = self._held_bytes.get(tenant, 0) - transfer.held_bytes
            if held_bytes:
                self._held_bytes[tenant] = held_bytes
            else:
                self._held_bytes.pop(tenant, None)
            self._scratch_held -= transfer.held_bytes
            transfer.held_bytes = 0
