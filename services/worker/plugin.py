"""vLLM general-plugin entry point (``vllm.general_plugins`` group, name ``preft``).

vLLM calls :func:`register` in every process it starts (API server, engine core, workers);
it must be cheap and idempotent. The scheduler and worker classes are chosen by engine
arguments instead (see :mod:`preft_serve.worker.engine_config`).
"""

import logging

logger = logging.getLogger(__name__)


def register() -> None:
    """Install PreFT's process-wide seams (prefix-cache keys, CPU LoRA kernels)."""
    from preft_serve.worker import vllm_compat

    vllm_compat.install()
