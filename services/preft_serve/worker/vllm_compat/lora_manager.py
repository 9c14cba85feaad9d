"""Seam 2c, cold adapters parsed off the engine loop: ``vllm/lora/worker_manager.py`` and
``vllm/lora/peft_helper.py`` (vLLM 0.32.0).

Relies on:

- ``WorkerLoRAManager._load_adapter(lora_request)``: parses an adapter's directory into a
  host-memory ``LoRAModel``; vLLM calls it when a request with the adapter is scheduled,
  inside the engine loop. It is replaced by a call into a background
  :class:`~preft_serve.worker.adapter_tiers.background_parse.AdapterPreloader`, so the step
  only copies parsed weights into a slot.
- ``WorkerLoRAManager.list_adapters``, ``lora_config`` and ``max_position_embeddings``.
- ``PEFTHelper.from_local_dir`` / ``validate_legal``: what stock ``add_lora`` refuses at
  once (a missing directory, a config the engine cannot serve) is still refused at once,
  from ``adapter_config.json`` alone.
- ``LoRAAdapterNotFoundError`` (``vllm/exceptions.py``): the server's 404 for a missing one.
"""

from __future__ import annotations

import os
from typing import Any

from vllm.exceptions import LoRAAdapterNotFoundError
from vllm.lora.peft_helper import PEFTHelper

from preft_serve.worker.adapter_tiers.background_parse import (
    DEFAULT_GIL_YIELD,
    AdapterPreloader,
    GilYield,
)

_PRELOADER_ATTR = "_preft_preloader"


def install_preloader(
    manager: Any, threads: int = 1, share_gil: GilYield | None = DEFAULT_GIL_YIELD
) -> AdapterPreloader:
    """Route ``manager._load_adapter`` (vLLM's ``WorkerLoRAManager``: parse an adapter's
    directory into a ``LoRAModel`` on the host) through a background preloader."""
    existing = preloader_of(manager)
    if existing is not None:
        return existing
    stock = manager._load_adapter
    capacity = max(int(getattr(manager.lora_config, "max_cpu_loras", 0) or 0), 1)
    preloader = AdapterPreloader(stock, threads=threads, capacity=capacity, share_gil=share_gil)

    def load_adapter(lora_request: Any) -> Any:
        return preloader.load(lora_request.lora_int_id, lora_request)

    manager._load_adapter = load_adapter
    setattr(manager, _PRELOADER_ATTR, preloader)
    return preloader


def preloader_of(manager: Any) -> AdapterPreloader | None:
    """The preloader :func:`install_preloader` gave ``manager`` (None: none, or no manager)."""
    return getattr(manager, _PRELOADER_ATTR, None) if manager is not None else None


def start_background_parse(manager: Any, lora_request: Any) -> bool:
    """Start parsing a new adapter in the background; False where stock vLLM must handle
    it (no preloader, already in host memory, or an in-place reload).

    Raises what stock ``add_lora`` raises at once: ``LoRAAdapterNotFoundError`` for a missing
    directory (404) and vLLM's ``ValueError`` for a config the engine cannot serve (rank,
    bias...; 400).
    """
    preloader = preloader_of(manager)
    if (
        preloader is None
        or lora_request.load_inplace
        or not os.path.isabs(lora_request.lora_path)  # stock may fetch it from a hub
        or lora_request.lora_int_id in manager.list_adapters()
    ):
        return False
    try:
        helper = PEFTHelper.from_local_dir(lora_request.lora_path, manager.max_position_embeddings)
    except FileNotFoundError as exc:
        raise LoRAAdapterNotFoundError(lora_request.lora_name, lora_request.lora_path) from exc
    helper.validate_legal(manager.lora_config)
    preloader.submit(lora_request.lora_int_id, lora_request)
    return True
