"""Engine arguments that turn stock vLLM into a PreFT engine.

Used alike by the worker launcher (as CLI flags), the tests and the benchmarks (as
``vllm.LLM`` keyword arguments), so all three run the same engine.
"""

from __future__ import annotations

import os
from typing import Any

SCHEDULER_CLS = "preft_serve.worker.vllm_compat.scheduler.PreftScheduler"
CPU_WORKER_CLS = "preft_serve.worker.vllm_compat.workers.PreftCPUWorker"
GPU_WORKER_CLS = "preft_serve.worker.vllm_compat.workers.PreftGPUWorker"


def preft_engine_kwargs(device: str = "cpu") -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` / ``EngineArgs`` enabling PreFT scheduling."""
    # The V2 model runner maps tokens to adapters in code the plugin does not hook.
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    return {
        "scheduler_cls": SCHEDULER_CLS,
        "worker_cls": CPU_WORKER_CLS if device == "cpu" else GPU_WORKER_CLS,
        "enable_lora": True,
        # PreftScheduler extends the synchronous Scheduler, and the adapter gate's report
        # rides on ModelRunnerOutput, which async scheduling wraps. vLLM turns async
        # scheduling on by default on GPUs (the CPU platform turns it off).
        "async_scheduling": False,
    }


def preft_cli_args(device: str = "cpu") -> list[str]:
    """The same settings as ``vllm.entrypoints.openai.api_server`` flags."""
    kwargs = preft_engine_kwargs(device)
    return [
        "--scheduler-cls",
        kwargs["scheduler_cls"],
        "--worker-cls",
        kwargs["worker_cls"],
        "--enable-lora",
        "--no-async-scheduling",
    ]
