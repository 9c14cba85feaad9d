"""The CPU worker freezes the GC heap after warm-up, as vLLM's GPU worker does: a full
collection then skips the model's and vLLM's static objects instead of pausing a step."""

from __future__ import annotations

import gc

import pytest
from vllm.v1.worker.cpu_worker import CPUWorker

from preft_serve.worker.vllm_compat.workers import PreftCPUWorker


def test_warm_up_ends_with_the_heap_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CPUWorker, "compile_or_warm_up_model", lambda self: "times")
    gc.unfreeze()
    static = [[i] for i in range(1000)]  # GC-tracked objects alive at warm-up's end
    assert gc.get_freeze_count() == 0
    worker = object.__new__(PreftCPUWorker)  # the method needs no engine state

    assert worker.compile_or_warm_up_model() == "times"  # vLLM's result passed on
    assert gc.get_freeze_count() >= len(static)
    gc.unfreeze()
