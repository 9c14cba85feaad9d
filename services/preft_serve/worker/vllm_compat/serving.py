"""Seams 5 and 7, vLLM's OpenAI server: ``vllm/entrypoints/openai/models/serving.py``,
``vllm/entrypoints/serve/engine/serving.py`` and ``vllm/exceptions.py`` (vLLM 0.32.0).

Relies on:

- (5) ``OpenAIServingModels.resolve_lora`` and ``BaseServing._check_model`` answering 404
  when every resolver returns None and not catching a resolver's exceptions, which reach
  the app's handlers; a ``GracefulHTTPError`` becomes an OpenAI error body with its own
  status. :class:`AdapterStoreUnavailable` uses that for a 503 (:mod:`.lora_resolver`).
- (7) ``BaseServing._check_model(request)``, awaited first by the chat and completion
  serving classes, returning early for names in ``models.lora_requests`` (it asks no
  resolver for those): :func:`install_adapter_use_hook` wraps it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from vllm.exceptions import GracefulHTTPError


class AdapterStoreUnavailable(GracefulHTTPError):
    """Raised by the resolver when the object store cannot be used: vLLM answers 503 with
    this fixed message (the client learns nothing about hashes, paths or errno)."""

    MESSAGE = "the adapter store is unavailable; retry shortly"

    def __init__(self) -> None:
        super().__init__(self.MESSAGE, HTTPStatus.SERVICE_UNAVAILABLE)


class _AdapterUseHook:
    """The process's one ``on_use`` callback (the latest installed), read by the wrapper."""

    on_use: Callable[[str], Awaitable[None]] | None = None


_ADAPTER_USE = _AdapterUseHook()


def install_adapter_use_hook(on_use: Callable[[str], Awaitable[None]]) -> None:
    """Call ``on_use(name)`` before each request for an adapter vLLM's server already holds
    under ``name`` (``BaseServing._check_model``, which the chat and completion serving
    classes await first: it returns early for names in ``models.lora_requests`` and asks no
    resolver). The resolver uses it to keep the disk cache's LRU true and to fetch an
    evicted adapter's directory again (``DiskCacheResolver.on_use``). The latest
    ``on_use`` wins; installing twice wraps once."""
    _ADAPTER_USE.on_use = on_use
    from vllm.entrypoints.serve.engine.serving import BaseServing

    serving: Any = BaseServing
    if getattr(serving._check_model, "_preft_adapter_use", False):
        return
    stock = serving._check_model

    async def _check_model(self: Any, request: Any) -> Any:
        name = getattr(request, "model", None)
        hook = _ADAPTER_USE.on_use
        if (
            hook is not None
            and isinstance(name, str)
            and name in getattr(self.models, "lora_requests", {})
        ):
            await hook(name)
        return await stock(self, request)

    _check_model._preft_adapter_use = True  # type: ignore[attr-defined]
    serving._check_model = _check_model
