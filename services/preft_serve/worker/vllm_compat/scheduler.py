"""Seam 1, the scheduler: ``vllm/v1/core/sched/scheduler.py`` (vLLM 0.32.0).

Relies on:

- ``Scheduler.schedule``: its ``max_loras`` admission check counts the ``lora_request`` of
  every scheduled running request, and only the running loop reads it there (block hashes
  are computed outside ``schedule()``). A prefill-only adapter whose prompt is computed
  needs no slot, so its ``lora_request`` is hidden from that count for the call (as is one
  past its adapter boundary: ``Request.sampling_params.extra_args``). ``Scheduler.running``
  is read before each call for the classic adapters holding slots, and each request's
  tenant from ``Request.sampling_params.extra_args`` (:mod:`preft_serve.worker.decode_slots`).
- ``Scheduler._handle_blocked_waiting_request``: the hook vLLM uses to skip a waiting request
  for a step (grammars, remote KV). The parse gate
  (:mod:`preft_serve.worker.adapter_tiers.parse_gate`) skips a request whose adapter the
  worker cannot yet run unparsed, while the worker parses it ahead; a classic adapter's
  request is skipped while classic adapters, or its tenant's, hold every slot they may
  (:mod:`preft_serve.worker.decode_slots`).
- ``Scheduler.update_from_output`` and ``grammar_compile_error_reqs``: the set it finishes
  with ``FINISHED_ERROR`` (and outputs) for requests that fail before running; a request
  whose adapter cannot be read ends through it.
- ``SchedulerOutput`` and ``ModelRunnerOutput`` travel pickled between processes, so an
  extra attribute survives: the adapters to parse ride on the first (``ANNOUNCE_ATTR``),
  the worker's report on the second (``REPORT_ATTR``), through
  :class:`~preft_serve.worker.vllm_compat.workers.PreftWorkerMixin`.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from preft_serve.worker.adapter_tiers.parse_gate import AdapterGate
from preft_serve.worker.decode_slots import DecodeSlots, reserved_slots, tenant_slots
from preft_serve.worker.settings import WorkerSettings
from preft_serve.worker.token_mapping import in_prompt_phase
from preft_serve.worker.vllm_compat.lora_request import (
    adapter_end_of,
    adapter_info_of,
    adapter_kinds,
    tenant_of_request,
)

ANNOUNCE_ATTR = "preft_announce"
"""Attribute of a ``SchedulerOutput``: the ``LoRARequest`` objects to parse ahead."""
REPORT_ATTR = "preft_adapter_report"
"""Attribute of a ``ModelRunnerOutput``: the worker's ``parse_gate.Report``."""


class PreftSchedulerMixin:
    """Frees a prefill-only adapter's slot once its request's prompt (or the part before its
    adapter boundary) is computed, keeps some slots from adapters applied to every token
    (``decode_slots.py``), and holds a waiting request back while its adapter is parsed
    (``parse_gate.py``).

    Combined with vLLM's ``Scheduler`` below, which mypy cannot see as its base: the
    ``super()`` calls into vLLM are ``type: ignore[misc]`` for that reason only."""

    lora_config: Any
    running: list[Any]
    adapter_gate: AdapterGate
    decode_slots: DecodeSlots | None  # None: no LoRA, or no limit under max_loras
    grammar_compile_error_reqs: set[str]  # vLLM's; see update_from_output
    _adapter_failed_reqs: set[str]  # waiting requests whose adapter cannot be read

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = WorkerSettings()
        self.adapter_gate = AdapterGate(hold_s=settings.adapter_hold_ms / 1000)
        self._adapter_failed_reqs = set()
        self.decode_slots = None
        if self.lora_config:
            max_loras = self.lora_config.max_loras
            classic = max_loras - reserved_slots(max_loras, settings.prefill_reserved_slots)
            per_tenant = tenant_slots(classic, settings.tenant_classic_slots)
            if classic < max_loras or per_tenant < classic:
                self.decode_slots = DecodeSlots(classic, per_tenant)

    def _handle_blocked_waiting_request(self, request: Any) -> bool:
        """vLLM skips a waiting request for this step when this says False (it does so for
        requests waiting for a grammar or remote KV blocks)."""
        if not super()._handle_blocked_waiting_request(request):  # type: ignore[misc]
            return False
        lora = request.lora_request
        if lora is None or not self.lora_config or adapter_kinds(lora)[0]:
            return True  # ReFT adapters load in their runtime, not the LoRA manager
        if self.adapter_gate.failed(lora.lora_int_id):
            self._adapter_failed_reqs.add(request.request_id)
            return False
        if not self.adapter_gate.admit(lora.lora_int_id, lora):
            return False
        slots = self.decode_slots
        if slots is None or adapter_kinds(lora)[1]:
            return True
        return slots.admit(lora.lora_int_id, tenant_of_request(request))

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
            scheduler_output, model_runner_output
        )

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if not self.lora_config:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        if self.decode_slots is not None:
            self.decode_slots.begin_step(
                (request.lora_request.lora_int_id, tenant_of_request(request))
                for request in self.running
                if request.lora_request is not None
                and adapter_kinds(request.lora_request) == (False, False)
            )
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
            and not in_prompt_phase(request.num_computed_tokens, adapter_end_of(request))
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
