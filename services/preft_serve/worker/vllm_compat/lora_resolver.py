"""Seam 5, LoRA resolvers: ``vllm/lora/resolver.py`` and ``vllm/lora/request.py``
(vLLM 0.32.0), for :mod:`preft_serve.worker.adapter_tiers.resolver`.

Relies on:

- ``OpenAIServingModels`` asking each resolver in ``LoRAResolverRegistry``
  (``register_resolver``, ``get_supported_resolvers``, ``get_resolver``; one per name)
  ``resolve_lora(base_model_name, lora_name)`` for a name it does not know, loading the
  ``LoRARequest(lora_name, lora_int_id, lora_path)`` returned, answering 404 for None.
- The 503 and the adapter-use hook of :mod:`.serving`.
"""

from __future__ import annotations

from vllm.lora.request import LoRARequest
from vllm.lora.resolver import LoRAResolver, LoRAResolverRegistry

from preft_serve.common.objectstore import StoreUnavailable
from preft_serve.worker.adapter_tiers.disk_cache import AdapterDiskCache
from preft_serve.worker.adapter_tiers.resolver import DiskCacheResolver
from preft_serve.worker.settings import WorkerSettings
from preft_serve.worker.vllm_compat.serving import (
    AdapterStoreUnavailable,
    install_adapter_use_hook,
)

RESOLVER_NAME = "preft-object-store"


class ObjectStoreResolver(LoRAResolver):
    """vLLM's resolver for ``sha256:<hex>`` names: :class:`DiskCacheResolver`'s adapter as
    a ``LoRARequest``, an object store that cannot be used as a 503."""

    def __init__(self, settings: WorkerSettings, cache: AdapterDiskCache | None = None) -> None:
        self.settings = settings
        self.adapters = DiskCacheResolver(settings, cache)

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        try:
            adapter = await self.adapters.resolve(lora_name)
        except StoreUnavailable:
            raise AdapterStoreUnavailable() from None  # 503; no hash, path or errno in it
        if adapter is None:
            return None
        return LoRARequest(
            lora_name=adapter.name, lora_int_id=adapter.int_id, lora_path=adapter.path
        )


def register_resolver(settings: WorkerSettings | None = None) -> ObjectStoreResolver | None:
    """Register the resolver with vLLM if an object store is configured; idempotent."""
    settings = settings or WorkerSettings()
    if not settings.resolver_enabled:
        return None
    if RESOLVER_NAME in LoRAResolverRegistry.get_supported_resolvers():
        existing = LoRAResolverRegistry.get_resolver(RESOLVER_NAME)
        if isinstance(existing, ObjectStoreResolver) and existing.settings == settings:
            return existing
    resolver = ObjectStoreResolver(settings)
    LoRAResolverRegistry.register_resolver(RESOLVER_NAME, resolver)
    install_adapter_use_hook(resolver.adapters.on_use)
    return resolver
