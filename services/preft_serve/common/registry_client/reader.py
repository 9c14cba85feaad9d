"""What a service that serves requests reads from the registry, as an interface.

The gateway depends on :class:`AsyncRegistryReader`, not on :class:`AsyncRegistryClient`
or its Redis connection: the client is one implementation, tests pass small fakes.
"""

from __future__ import annotations

from typing import Protocol

from preft_serve.common.registry_client.contract import AdapterRef, KeyOwner


class AsyncRegistryReader(Protocol):
    """Lookups of tenants' keys, bindings and adapters (see :class:`AsyncRegistryClient`)."""

    async def authenticate(self, api_key: str) -> KeyOwner | None:
        """Owner of a valid API key, else None."""

    async def resolve_user(self, tenant: str, user: str) -> AdapterRef | None:
        """The adapter bound to ``user``, else None (the base model)."""

    async def resolve_adapter(self, tenant: str, name: str) -> AdapterRef | None:
        """The current version of a tenant's adapter, else None."""

    async def adapter_names(self, tenant: str, limit: int = 1000) -> list[str]:
        """The tenant's first ``limit`` adapter names in name order."""

    async def adapters(self, tenant: str, limit: int = 1000) -> list[AdapterRef]:
        """Current versions of the tenant's first ``limit`` adapters in name order."""

    def cache_sizes(self) -> dict[str, int]:
        """Entries in each lookup cache, for metrics (empty without a cache)."""

    async def aclose(self) -> None:
        """Release what the reader holds."""
