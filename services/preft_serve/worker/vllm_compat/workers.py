"""Seam 2b, the worker classes: ``vllm/v1/worker/cpu_worker.py`` and
``vllm/v1/worker/gpu_worker.py`` (vLLM 0.32.0), named by the engine arguments
(:mod:`preft_serve.worker.engine_config`).

Relies on:

- ``init_device`` creating ``self.model_runner``: the PreFT runner
  (:mod:`.model_runner`) is grafted onto its class right after.
- ``execute_model(scheduler_output)`` / ``sample_tokens(grammar_output)`` returning a
  ``ModelRunnerOutput`` (``vllm/v1/outputs.py``), None or an async handle: the parse gate's
  messages (:mod:`.scheduler`) pass through here.
- ``CPUWorker.compile_or_warm_up_model`` not freezing the GC heap after warm-up, which
  ``GPUWorker``'s does (``vllm/utils/gc_utils.py::freeze_gc_heap``).
"""

from __future__ import annotations

import copy
from typing import Any

from vllm.utils.gc_utils import freeze_gc_heap, maybe_attach_gc_debug_callback
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_worker import Worker as GPUWorker

from preft_serve.worker.vllm_compat.model_runner import graft_preft_runner
from preft_serve.worker.vllm_compat.scheduler import ANNOUNCE_ATTR, REPORT_ATTR


class PreftWorkerMixin:
    """The PreFT runner grafted in, and the parse gate's messages passed through: the
    scheduler output's announcements to the runner, the runner's report onto the output
    that goes back to the scheduler (both travel pickled: extra attributes survive).

    Combined with vLLM's worker classes below, which mypy cannot see as its bases: the
    ``super()`` calls into vLLM are ``type: ignore[misc]`` for that reason only."""

    model_runner: Any

    def init_device(self) -> None:
        super().init_device()  # type: ignore[misc]
        graft_preft_runner(self)

    def execute_model(self, scheduler_output: Any) -> Any:
        announced = getattr(scheduler_output, ANNOUNCE_ATTR, None)
        runner = self.model_runner
        if announced:
            runner.start_background_parses(announced)
        if not scheduler_output.total_num_scheduled_tokens:
            runner.wait_for_parses()
        return self._with_adapter_report(super().execute_model(scheduler_output))  # type: ignore[misc]

    def sample_tokens(self, grammar_output: Any) -> Any:
        return self._with_adapter_report(super().sample_tokens(grammar_output))  # type: ignore[misc]

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
        """As vLLM's, then the GC heap frozen, as vLLM's GPU worker does after its warm-up:
        otherwise every full collection walks the model's and vLLM's static objects, a
        pause of tens to hundreds of ms in the middle of a step, and parsing adapters
        (hundreds of tensors each) triggers them."""
        result = super().compile_or_warm_up_model()
        freeze_gc_heap()
        maybe_attach_gc_debug_callback()  # VLLM_GC_DEBUG=1 logs each collection's time
        return result


class PreftGPUWorker(PreftWorkerMixin, GPUWorker):
    """vLLM's GPU worker whose model runner maps tokens to adapters per PreFT."""
