"""The engine arguments that make stock vLLM a PreFT engine, as vLLM's own CLI reads them."""

from __future__ import annotations

import pytest

from preft_serve.worker.engine_config import (
    CPU_WORKER_CLS,
    GPU_WORKER_CLS,
    SCHEDULER_CLS,
    preft_cli_args,
    preft_engine_kwargs,
)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_cli_flags_and_keyword_arguments_say_the_same(device: str) -> None:
    """Async scheduling is off on every device: PreftScheduler extends the synchronous
    scheduler, and vLLM turns async scheduling on by default on GPUs."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    parsed = parser.parse_args(["--model", "m", *preft_cli_args(device)])
    kwargs = preft_engine_kwargs(device)
    assert parsed.scheduler_cls == kwargs["scheduler_cls"] == SCHEDULER_CLS
    assert (
        parsed.worker_cls
        == kwargs["worker_cls"]
        == (CPU_WORKER_CLS if device == "cpu" else GPU_WORKER_CLS)
    )
    assert parsed.enable_lora is kwargs["enable_lora"] is True
    assert parsed.async_scheduling is kwargs["async_scheduling"] is False
