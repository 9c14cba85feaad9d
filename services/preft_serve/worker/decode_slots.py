"""How many adapter slots adapters applied to every token may hold at once.

vLLM runs at most ``max_loras`` distinct adapters in a step, and a running request keeps
its adapter's slot. A prefill-only adapter gives the slot back once its prompt is computed
(seam 1, :mod:`preft_serve.worker.vllm_compat.scheduler`); an adapter applied to every
token keeps it until its request ends, for a long answer minutes. Without a limit,
``max_loras`` long answers on distinct classic adapters (one tenant's, say) would take every
slot, and every other adapter request on the worker, however short its own work, would
wait until one of them ended. So classic adapters hold at most ``max_loras - reserved``
slots at once and the rest stay free for prefill-only adapters, which hold one for the
length of a prompt's compute. A classic adapter already running takes no new slot: its
further requests are never held back.
"""

from __future__ import annotations

from collections.abc import Iterable


def reserved_slots(max_loras: int, setting: int | None) -> int:
    """Slots classic adapters may not take: ``setting``, or by default a quarter of
    ``max_loras`` and at least one where there are two or more. Refuses a setting that
    would leave classic adapters no slot at all."""
    if setting is None:
        return max(1, max_loras // 4) if max_loras >= 2 else 0
    if setting >= max_loras:
        raise ValueError(
            f"PREFT_WORKER_PREFILL_RESERVED_SLOTS={setting} leaves no adapter slot for "
            f"adapters applied to every token (--max-loras is {max_loras}): set it under "
            "--max-loras, or 0 to reserve none"
        )
    return setting


class DecodeSlots:
    """The classic adapters holding slots in the current step, and whether one more may.

    The scheduler calls :meth:`begin_step` with the adapters of its running classic
    requests before each step is scheduled, then :meth:`admit` for each waiting classic
    request it considers; an admitted adapter counts at once, so two waiting requests
    cannot both take the last slot."""

    def __init__(self, max_loras: int, reserved: int) -> None:
        self.limit = max_loras - reserved
        self.held: set[int] = set()
        self.refused = 0  # waiting requests held back for a step: what the limit cost

    def begin_step(self, running: Iterable[int]) -> None:
        self.held = set(running)

    def admit(self, lora_id: int) -> bool:
        if lora_id in self.held:
            return True
        if len(self.held) >= self.limit:
            self.refused += 1
            return False
        self.held.add(lora_id)
        return True
