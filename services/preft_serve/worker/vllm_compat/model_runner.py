"""Seam 2a, the model runner: ``vllm/v1/worker/lora_model_runner_mixin.py`` and
``vllm/v1/worker/gpu_model_runner.py`` (V1 runner; vLLM 0.32.0).

Relies on:

- ``LoRAModelRunnerMixin.set_active_loras(input_batch, num_scheduled_tokens,
  num_sampled_tokens, mapping_type)`` and ``_set_active_loras(prompt_mapping,
  token_mapping, lora_requests, mapping_type)``; the ``InputBatch`` fields
  ``request_lora_mapping``, ``lora_id_to_lora_request``, ``num_computed_tokens_cpu`` and
  ``num_prompt_tokens``; ``GPUModelRunner.requests`` (``CachedRequestState.sampling_params``,
  for a request's adapter boundary). Tokens are mapped to adapters per PreFT
  (:mod:`preft_serve.worker.token_mapping`); adapters without tokens in the step are not
  activated. It runs once per executed step, so it also marks step starts for
  :mod:`preft_serve.worker.step_trace`.
- ``add_lora`` / ``remove_lora`` / ``list_loras``: ReFT adapters go to
  :class:`~preft_serve.worker.reft.runtime.ReftRuntime`; a LoRA's weights are parsed in the
  background (:mod:`.lora_manager`) instead of in the engine loop.
- ``GPUModelRunner.load_model``, ``get_model``, ``model_config``, ``lora_config``,
  ``lora_manager``, ``device`` and ``vllm_config``. ReFT hooks the decoder layers
  (``model.model.layers``, whose outputs are ``(hidden_states, residual)`` in vLLM's Llama
  and Qwen2).
- The V2 model runner (default on GPU when Triton exists) maps tokens elsewhere: the
  engine arguments set ``VLLM_USE_V2_MODEL_RUNNER=0``
  (:mod:`preft_serve.worker.engine_config`).
- ``CompilationMode`` (``vllm/config/compilation.py``): layers are bypassed
  (:mod:`.lora_layers`) only when the model runs eagerly.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from preft_serve.adapters.families import Runtime
from preft_serve.worker.adapter_tiers.parse_gate import SettledReport
from preft_serve.worker.reft.kernels import reft_kernel_for
from preft_serve.worker.reft.runtime import ReftRuntime
from preft_serve.worker.settings import WorkerSettings
from preft_serve.worker.step_trace import StepTrace, step_trace_from_env
from preft_serve.worker.token_mapping import NO_ADAPTER, StepMapping, step_mapping
from preft_serve.worker.vllm_compat.lora_layers import SlotRouter
from preft_serve.worker.vllm_compat.lora_manager import (
    install_preloader,
    preloader_of,
    start_background_parse,
)
from preft_serve.worker.vllm_compat.lora_request import (
    adapter_ends,
    adapter_info_of,
    adapter_kinds,
)

logger = logging.getLogger(__name__)


class PreftLoRAMappingMixin:
    """PreFT token mapping for vLLM's LoRA manager, and ReFT adapters beside it.

    Combined with vLLM's runner class at runtime (:func:`graft_preft_runner`), so mypy
    cannot see its base: every ``super()`` call into vLLM is ``type: ignore[misc]`` and every
    vLLM attribute read is ``type: ignore[attr-defined]``, for that reason only."""

    reft: ReftRuntime
    step_trace: StepTrace | None = None

    def load_model(self, *args: Any, **kwargs: Any) -> Any:
        result = super().load_model(*args, **kwargs)  # type: ignore[misc]
        self.step_trace = step_trace_from_env()
        hf = self.model_config.hf_config  # type: ignore[attr-defined]
        lora_config = self.lora_config  # type: ignore[attr-defined]
        capacity = lora_config.max_cpu_loras if lora_config else 0
        self.reft = ReftRuntime(
            hf.hidden_size,
            hf.num_hidden_layers,
            max(capacity, 1),
            device=self.device,  # type: ignore[attr-defined]
            kernel=reft_kernel_for(self.device),  # type: ignore[attr-defined]
        )
        self.reft.install(decoder_layers(self.get_model()))  # type: ignore[attr-defined]
        manager = getattr(self, "lora_manager", None)
        if manager is not None:
            install_preloader(manager, share_gil=WorkerSettings().preload_share_gil())
            self.slot_router = SlotRouter.install(manager, bypass=runs_eagerly(self.vllm_config))  # type: ignore[attr-defined]
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
        kinds = {i: adapter_kinds(r) for i, r in requests.items()}
        per_request = [
            kinds[i] if i != NO_ADAPTER else (False, False) for i in adapter_ids.tolist()
        ]
        is_reft = np.fromiter((k[0] for k in per_request), dtype=bool, count=n)
        prefill_only = np.fromiter((k[1] for k in per_request), dtype=bool, count=n)
        reft_ids = [i for i, (reft, _) in kinds.items() if reft]
        lora_ids = np.where(is_reft, NO_ADAPTER, adapter_ids)
        num_computed = input_batch.num_computed_tokens_cpu[:n]
        # "Prompt" below means the tokens the adapter covers: a request's boundary may end
        # it inside the prompt (the rest then runs as decode tokens do).
        num_prompt = adapter_ends(
            self.requests,  # type: ignore[attr-defined]
            input_batch.req_ids,
            input_batch.num_prompt_tokens[:n],
            prefill_only,
        )
        in_prompt = num_computed < num_prompt
        if np.any((lora_ids != NO_ADAPTER) & (in_prompt | ~prefill_only)):
            mapping = step_mapping(
                lora_ids,
                prefill_only,
                num_computed,
                num_prompt,
                num_scheduled_tokens[:n],
                num_sampled_tokens[:n],
            )
            active = {requests[i] for i in mapping.active_ids()}
        else:  # no token of the step has a LoRA (decode steps of prefill-only adapters)
            mapping = StepMapping(
                np.zeros(int(num_scheduled_tokens[:n].sum()), dtype=np.int64),
                np.zeros(int(num_sampled_tokens[:n].sum()), dtype=np.int64),
            )
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
            num_computed,
            num_prompt,
            num_scheduled_tokens[:n],
        )
        if self.step_trace is not None:
            self.step_trace.mark(
                int(num_scheduled_tokens[:n].sum()),
                n,
                adapter_s=time.monotonic() - started,
                start=started,
            )

    def add_lora(self, lora_request: Any) -> bool:
        """Register an adapter without parsing its weights in the engine loop (see
        :func:`.lora_manager.start_background_parse`); ReFT adapters go to the ReFT
        runtime."""
        if adapter_info_of(lora_request).runtime is Runtime.REFT:
            self.reft.load(lora_request.lora_int_id, lora_request.lora_path)
            return True
        manager = getattr(self, "lora_manager", None)
        if start_background_parse(manager, lora_request):
            return True
        preloader = preloader_of(manager)
        if lora_request.load_inplace and preloader is not None:
            # New weights under an id whose old ones may still be parsing ahead: the load
            # below goes through the preloader, which must not hand out the old parse.
            preloader.discard(lora_request.lora_int_id)
        added: bool = super().add_lora(lora_request)  # type: ignore[misc]
        return added

    def remove_lora(self, lora_id: int) -> bool:
        removed = self.reft.remove(lora_id)
        preloader = preloader_of(getattr(self, "lora_manager", None))
        if preloader is not None and preloader.pending(lora_id):
            preloader.discard(lora_id)
            removed = True
        return super().remove_lora(lora_id) or removed  # type: ignore[misc]

    def list_loras(self) -> set[int]:
        preloader = preloader_of(getattr(self, "lora_manager", None))
        pending = preloader.pending_ids() if preloader is not None else set()
        engine_ids: set[int] = super().list_loras()  # type: ignore[misc]
        return engine_ids | self.reft.loaded_ids() | pending

    # The scheduler's parse gate (seam 1): it announces adapters whose requests it holds
    # back; the worker parses them ahead and reports what it can run unparsed.

    _settled_report: SettledReport | None = None

    def start_background_parses(self, lora_requests: list[Any]) -> None:
        """Start background parses of announced adapters; one that cannot even start (a
        missing directory, a config the engine cannot serve) is reported failed."""
        manager: Any = getattr(self, "lora_manager", None)
        preloader = preloader_of(manager)
        if preloader is None:
            return
        report = self._report_state()
        for lora_request in lora_requests:
            lora_id = lora_request.lora_int_id
            if preloader.pending(lora_id):
                continue
            try:
                started = start_background_parse(manager, lora_request)
            except Exception as exc:  # noqa: BLE001 - the step's own load would raise it
                # (a directory gone, a config the engine cannot serve): inside the engine
                # loop, where it would stop the engine. Its requests fail instead.
                logger.warning(
                    "adapter %d cannot be loaded (%s: %s); its requests fail",
                    lora_id,
                    type(exc).__name__,
                    exc,
                )
                report.fail(lora_id)
                continue
            if not started and lora_id not in manager.list_adapters():
                report.give_up(lora_id)

    def adapter_report(self) -> Any:
        """What the gate needs after this step (None: nothing changed): adapters in host
        memory or parsed ahead, and announced ones that will not be parsed ahead."""
        manager: Any = getattr(self, "lora_manager", None)
        preloader = preloader_of(manager)
        if preloader is None:
            return None
        report = self._report_state()
        for lora_id, error in preloader.failed_ids().items():
            logger.warning(
                "adapter %d: its weights cannot be read (%s: %s); its requests "
                "fail instead of being scheduled",
                lora_id,
                type(error).__name__,
                error,
            )
            report.fail(lora_id)
            preloader.discard(lora_id)  # a later request parses it anew (gate: FAILED_S)
        settled = frozenset(manager.list_adapters()) | preloader.settled_ids()
        return report.next(settled)

    def wait_for_parses(self, timeout_s: float = 0.02) -> None:
        """A step with nothing to run (every waiting request held for its adapter): the
        parses need not yield to a step, and the engine loop should not spin."""
        preloader = preloader_of(getattr(self, "lora_manager", None))
        if preloader is not None:
            preloader.hurry(timeout_s)

    def _report_state(self) -> SettledReport:
        if self._settled_report is None:
            self._settled_report = SettledReport()
        return self._settled_report


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
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


def runs_eagerly(vllm_config: Any) -> bool:
    """No torch.compile: swapping a layer's ``forward`` between steps is then free (under
    compilation it would invalidate the traced graph)."""
    from vllm.config.compilation import CompilationMode

    return bool(
        vllm_config.model_config.enforce_eager
        or vllm_config.compilation_config.mode == CompilationMode.NONE
    )


_RUNNER_CLASSES: dict[type, type] = {}


def graft_preft_runner(worker: Any) -> None:
    """Give the worker's model runner the PreFT mapping (a subclass of its own class)."""
    runner = getattr(worker, "model_runner", None)
    if runner is None or isinstance(runner, PreftLoRAMappingMixin):
        return
    base = type(runner)
    if base not in _RUNNER_CLASSES:
        _RUNNER_CLASSES[base] = type(f"Preft{base.__name__}", (PreftLoRAMappingMixin, base), {})
    runner.__class__ = _RUNNER_CLASSES[base]
