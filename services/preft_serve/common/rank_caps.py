"""The adapter ranks the workers serve, and so the registry must enforce at upload.

The registry checks an adapter once; workers load it on every request. An adapter the
registry accepts but workers refuse is a 201 on upload and a 400 on every request after it
(a registry allowing LoRA r <= 64 beside workers started with ``--max-lora-rank 16``). So
the defaults live here, once: the worker launcher's flags
(``worker/serve.py``), the registry's settings (``registry/settings.py``), the local stack
and the Helm chart's ``worker.maxLoraRank`` (which feeds both; tests/chart checks it equals
this default) all take them from :data:`RANK_CAPS`. Torch-free: the registry imports it.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RankCaps:
    """What one deployment's workers accept; a registry in front of them must not accept more.

    ``max_lora_rank`` is vLLM's ``--max-lora-rank``: the engine sizes its LoRA buffers for it
    and refuses a request for an adapter with a larger ``r``; vLLM allows only the values of
    ``vllm.config.lora.MaxLoRARanks`` (1, 8, 16, 32, 64, 128, ...). ``max_reft_rank`` bounds
    ReFT ``rank``: ReFT adapters bypass vLLM's LoRA path (``worker/reft``) and have no worker
    flag, but the GPU kernel holds at most :data:`REFT_KERNEL_MAX_RANK`.
    """

    max_lora_rank: int = 16
    max_reft_rank: int = 64


RANK_CAPS = RankCaps()

# preft_kernels.reft_triton.MAX_RANK (tests/common/test_rank_caps.py keeps them equal).
REFT_KERNEL_MAX_RANK = 128
