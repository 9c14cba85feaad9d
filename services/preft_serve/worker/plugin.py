"""vLLM general-plugin entry point (``vllm.general_plugins`` group, name ``preft``).

vLLM calls :func:`register` in every process it starts (API server, engine core, workers);
it must be cheap and idempotent. The scheduler and worker classes are chosen by engine
arguments instead (see :mod:`preft_serve.worker.engine_config`).
"""

import logging

logger = logging.getLogger(__name__)


def register() -> None:
    """Install PreFT's process-wide seams (prefix-cache keys, CPU LoRA kernels) and, when
    ``PREFT_WORKER_OBJECT_STORE_URL`` is set, the load-by-hash LoRA resolver."""
    from preft_serve.worker import vllm_compat
    from preft_serve.worker.vllm_compat.lora_resolver import register_resolver

    vllm_compat.install()
    if register_resolver() is not None:
        logger.info("preft: adapters named sha256:<hex> load from the object store")
