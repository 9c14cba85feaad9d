"""Which adapter a request runs, from its ``model`` field and its user.

Rules (also in the app's OpenAPI description, /docs):

* ``model`` names one of the tenant's adapters -> that adapter (the user is ignored);
  ``name@version`` pins one version of it, staged ones included (a version that does
  not exist: 404 naming the versions that do and the one served).
* ``model`` equals the base model's public name -> the user's binding if the user has one,
  else the base model, or a 404 where the tenant's ``unbound_user`` setting is
  ``not_found`` (``common.tenant_serving``).
* ``model`` omitted -> the user's binding; a user without a binding gets 404 (the caller
  asked for "my adapter" and there is none: failing loudly beats silently serving the
  base model). Without both ``model`` and a user, 400.
* Any other ``model`` (including another tenant's adapter name) -> the same 404 as a name
  that does not exist anywhere, so names do not leak across tenants.

The registry client cannot tell "unknown user" from "known user, no binding" (both resolve
to no binding), so both get the same 404.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from preft_serve.adapters.format import AdapterMode, AdapterType, format_model_name
from preft_serve.common.errors import BadRequest, NotFound
from preft_serve.common.registry_client import AdapterRef, split_pinned
from preft_serve.common.tenant_serving import UnboundUser
from preft_serve.gateway.classic_slots import ClassicRequest


class Resolver(Protocol):
    async def resolve_user(self, tenant: str, user: str) -> AdapterRef | None: ...

    async def resolve_adapter(self, tenant: str, name: str) -> AdapterRef | None: ...


@dataclass(frozen=True)
class Target:
    """What to send to the worker and what to show the client."""

    public_name: str  # adapter name, or the base model's public name
    worker_model: str  # "sha256:<hex>", or the worker's base model name
    routing_key: str  # what rendezvous hashing hashes on
    adapter: AdapterRef | None = None  # the adapter version served (None: the base model)

    def response_headers(self) -> dict[str, str]:
        """Which adapter version answered, for the client (``x-preft-adapter*``): the name
        alone does not say whether a hot swap has reached this request. The base model's
        answers say ``none``, so an answer that is not personalised is never silent."""
        if self.adapter is None:
            return {ADAPTER_HEADER: BASE_MODEL_ADAPTER}
        return {
            ADAPTER_HEADER: self.adapter.name,
            ADAPTER_VERSION_HEADER: str(self.adapter.version),
            ADAPTER_SHA256_HEADER: self.adapter.sha256,
        }

    @property
    def cold_tenant(self) -> str | None:
        """Whose cold-load budget a request to this target draws on when its worker has
        not loaded the adapter (the base model is always loaded: none)."""
        return self.adapter.tenant if self.adapter is not None else None

    @property
    def classic(self) -> ClassicRequest | None:
        """(tenant, key) where the adapter is a LoRA applied to every token: it keeps a
        worker's adapter slot until its answer ends (``classic_slots``); else None."""
        ref = self.adapter
        if ref is None or ref.type != AdapterType.LORA or ref.mode != AdapterMode.ALL:
            return None
        return ref.tenant, self.routing_key

    def log_fields(self) -> dict[str, object]:
        """What the access log says about the model served (the base model: no adapter)."""
        return {
            "model": self.public_name,
            "adapter": self.adapter.name if self.adapter else None,
            "adapter_version": self.adapter.version if self.adapter else None,
        }


ADAPTER_HEADER = "x-preft-adapter"
BASE_MODEL_ADAPTER = "none"
ADAPTER_VERSION_HEADER = "x-preft-adapter-version"
ADAPTER_SHA256_HEADER = "x-preft-adapter-sha256"


async def latest_version(
    resolver: Resolver, tenant: str, name: str, served: int, missing: int
) -> int:
    """The adapter's highest version, staged ones included, given that ``served`` exists
    and ``missing`` does not (an adapter's versions are 1 to its latest, none removed
    singly). Read through ``name@version`` lookups, which are never cached: the cached
    current version does not change when a version is staged above it, so it cannot say.
    Probes ``served + 1, + 2, + 4 ...`` then halves the gap: one lookup when nothing is
    staged, about two per doubling of the staged count otherwise."""

    async def exists(version: int) -> bool:
        return await resolver.resolve_adapter(tenant, f"{name}@{version}") is not None

    low, step = served, 1  # low exists
    high = missing  # high does not
    while low + step < high:
        if not await exists(low + step):
            high = low + step
            break
        low, step = low + step, step * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if await exists(middle) else (low, middle)
    return low


async def model_not_found(resolver: Resolver, tenant: str, model: str) -> NotFound:
    """The 404 of a ``model`` the tenant does not have; for ``name@version`` of an adapter
    it has, it says which versions exist (staged ones above the served one included)."""
    pinned = split_pinned(model)
    if (
        pinned is not None
        and (current := await resolver.resolve_adapter(tenant, pinned[0])) is not None
    ):
        name, wanted = pinned
        latest = current.version
        if wanted > current.version:
            latest = await latest_version(resolver, tenant, name, current.version, wanted)
        return NotFound(
            f"adapter '{name}' has no version {wanted}; its versions are "
            f"1 to {latest} ('{name}' alone is version {current.version})",
            code="model_not_found",
            param="model",
        )
    return NotFound(
        f"model '{model}' does not exist; GET /v1/models lists yours",
        code="model_not_found",
        param="model",
    )


def adapter_target(ref: AdapterRef) -> Target:
    return Target(ref.name, format_model_name(ref.sha256), ref.sha256, ref)


async def select_target(
    resolver: Resolver,
    tenant: str,
    model: str | None,
    user: str | None,
    *,
    base_name: str,
    worker_base_model: str,
    unbound_user: Callable[[], Awaitable[UnboundUser]] | None = None,
) -> Target:
    """The target of a request; ``unbound_user`` reads the tenant's setting, only when a
    user without a binding names the base model (None: the base model answers)."""
    base = Target(base_name, worker_base_model, "base")
    if model is not None and model != base_name:
        ref = await resolver.resolve_adapter(tenant, model)
        if ref is None:
            raise await model_not_found(resolver, tenant, model)
        return adapter_target(ref)
    if user is None:
        if model is None:
            raise BadRequest(
                "say which model to run: set 'model' to one of your adapters "
                f"(or '{base_name}'), or set 'user' (or the X-User-Id header) "
                "to use that user's adapter binding",
                param="model",
                code="missing_required_parameter",
            )
        return base
    ref = await resolver.resolve_user(tenant, user)
    if ref is not None:
        return adapter_target(ref)
    if model is None:
        raise NotFound(
            f"user {user} has no adapter binding; bind one with PUT /v1/users/{user}",
            code="adapter_binding_not_found",
            param="user",
        )
    if unbound_user is not None and await unbound_user() is UnboundUser.NOT_FOUND:
        raise NotFound(
            f"user {user} has no adapter binding, and this tenant does not serve "
            "the base model to users without one (its unbound_user setting is "
            f"not_found); bind one with PUT /v1/users/{user}",
            code="adapter_binding_not_found",
            param="user",
        )
    return base
