"""How many forwarded registry calls (files, fine-tuning, adapters, bindings, usage, keys,
the audit log) each tenant has open to the registry.

The gateway reaches the registry over a bounded connection pool. Without a bound per
tenant, one tenant's stalled uploads (a few bytes, then nothing) held every connection and
everyone's forwarded calls failed as if the registry were down. Each tenant
gets a share of calls and of uploads; all tenants' uploads together stay below the pool,
so the rest of the connections are always there for other calls. The last few upload slots
are kept for tenants with no upload in progress: tenants that each fill their own share
cannot, together, leave a new tenant without one. Counted in this process
(each gateway replica has its own shares): the point is this process's pool.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from preft_serve.common.errors import ServiceUnavailable, TooManyRequests

RETRY_AFTER = {"Retry-After": "1"}
UPLOAD_SHARE_CODE = "too_many_transfers"
"""A tenant over its share of uploads: the registry's own code for its share, so clients
wait out both the same way (nothing was sent on)."""


class RegistrySlots:
    """Shares of the registry connections: ``tenant_calls`` open calls and
    ``tenant_uploads`` uploads per tenant, ``uploads`` uploads in all, of which the last
    ``upload_reserve`` go only to tenants with no upload in progress."""

    def __init__(
        self, tenant_calls: int, tenant_uploads: int, uploads: int, upload_reserve: int = 0
    ) -> None:
        assert 0 <= upload_reserve < uploads, (upload_reserve, uploads)
        self.tenant_calls = tenant_calls
        self.tenant_uploads = tenant_uploads
        self.uploads = uploads
        self.upload_reserve = upload_reserve
        self._calls: Counter[str] = Counter()
        self._tenant_uploads: Counter[str] = Counter()
        self.open = 0  # calls, all tenants
        self.uploading = 0  # uploads, all tenants

    def take(self, tenant: str, upload: bool) -> Callable[[], None]:
        """A slot for one call (an upload when ``upload``); returns its release, to call
        exactly once when the call's answer is done. Over a share, or asking for a
        reserved upload slot while holding one: 429 naming the tenant's own limit; all
        upload slots taken: 503 (this gateway is busy)."""
        if self._calls[tenant] >= self.tenant_calls:
            raise TooManyRequests(
                f"this API key's tenant already has {self._calls[tenant]} calls to the "
                "adapter registry (files, fine-tuning, adapters, users, usage, keys, audit) "
                f"in progress; at most {self.tenant_calls} at once: retry when one of them "
                "finishes",
                headers=RETRY_AFTER,
            )
        if upload:
            if self._tenant_uploads[tenant] >= self.tenant_uploads:
                raise TooManyRequests(
                    f"this API key's tenant already has {self._tenant_uploads[tenant]} "
                    f"uploads in progress; at most {self.tenant_uploads} at once: retry "
                    "when one of them finishes",
                    code=UPLOAD_SHARE_CODE,
                    headers=RETRY_AFTER,
                )
            held = self._tenant_uploads[tenant]
            shared = self.uploads - self.upload_reserve
            if held and self.uploading >= shared:
                raise TooManyRequests(
                    f"this API key's tenant already has {held} uploads in progress and "
                    f"this gateway keeps its last {self.upload_reserve} upload slots for "
                    "tenants with none: retry when one of yours finishes",
                    code=UPLOAD_SHARE_CODE,
                    headers=RETRY_AFTER,
                )
            if self.uploading >= self.uploads:
                raise ServiceUnavailable(
                    f"this gateway is already forwarding {self.uploading} uploads, its "
                    "most at once; retry shortly",
                    code="uploads_busy",
                    headers=RETRY_AFTER,
                )
            self._tenant_uploads[tenant] += 1
            self.uploading += 1
        self._calls[tenant] += 1
        self.open += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            _drop(self._calls, tenant)
            self.open -= 1
            if upload:
                _drop(self._tenant_uploads, tenant)
                self.uploading -= 1

        return release


def _drop(counts: Counter[str], tenant: str) -> None:
    counts[tenant] -= 1
    if counts[tenant] <= 0:
        del counts[tenant]  # no entry per tenant ever seen
