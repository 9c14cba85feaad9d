"""Seam 6, engine arguments: ``vllm/config/lora.py::MaxLoRARanks`` (vLLM 0.32.0).

``max_lora_rank`` must be one of a fixed set of values; :func:`engine_max_lora_rank` rounds
an adapter's rank up to the nearest one.
"""

from __future__ import annotations

from typing import get_args


def engine_max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that serves adapters of ``rank``."""
    from vllm.config.lora import MaxLoRARanks

    accepted = sorted(int(r) for r in get_args(MaxLoRARanks))
    for value in accepted:
        if value >= rank:
            return value
    raise ValueError(f"rank {rank} is above vLLM's largest max_lora_rank ({accepted[-1]})")
