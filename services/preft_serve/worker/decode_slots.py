"""How many adapter slots adapters applied to every token may hold at once, in all and
per tenant.

vLLM runs at most ``max_loras`` distinct adapters in a step, and a running request keeps
its adapter's slot. A prefill-only adapter gives the slot back once its prompt is computed
(seam 1, :mod:`preft_serve.worker.vllm_compat.scheduler`); an adapter applied to every
token keeps it until its request ends, for a long answer minutes. Without a limit,
``max_loras`` long answers on distinct classic adapters would take every slot, and every
other adapter request on the worker, however short its own work, would wait until one of
them ended. So classic adapters hold at most ``max_loras - reserved`` slots at once, the
rest staying free for prefill-only adapters, which hold one for the length of a prompt's
compute; and one tenant's classic adapters hold at most ``tenant_limit`` of those, so
other tenants' classic adapters find one too. The tenant is the one the gateway names in
the request (:mod:`preft_serve.common.tenant_xarg`; a request without one counts toward
the total only). A classic adapter already running takes no new slot: its further
requests are never held back.
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


def tenant_slots(classic: int, setting: int | None) -> int:
    """Of the ``classic`` slots, how many one tenant's classic adapters may hold:
    ``setting`` (0: no per-tenant limit), or by default half of them, at least one."""
    if setting is None:
        return max(1, classic // 2)
    return min(setting, classic) if setting else classic


class DecodeSlots:
    """The classic adapters holding slots in the current step, and whether one more may.

    The scheduler calls :meth:`begin_step` with the adapters (and tenants) of its running
    classic requests before each step is scheduled, then :meth:`admit` for each waiting
    classic request it considers; an admitted adapter counts at once, so two waiting
    requests cannot both take the last slot. One that vLLM then skips for another reason
    (no KV blocks, its own slot check) stays counted for the rest of that step only: the
    next step starts from the running requests again."""

    def __init__(self, limit: int, tenant_limit: int) -> None:
        self.limit, self.tenant_limit = limit, tenant_limit
        self.held: set[int] = set()
        self.by_tenant: dict[str, set[int]] = {}
        self.refused = 0  # admits refused (one per waiting request per step held back)

    def begin_step(self, running: Iterable[tuple[int, str | None]]) -> None:
        self.held, self.by_tenant = set(), {}
        for lora_id, tenant in running:
            self._count(lora_id, tenant)

    def admit(self, lora_id: int, tenant: str | None) -> bool:
        if lora_id in self.held:
            return True
        if len(self.held) >= self.limit or (
            tenant is not None and len(self.by_tenant.get(tenant, ())) >= self.tenant_limit
        ):
            self.refused += 1
            return False
        self._count(lora_id, tenant)
        return True

    def _count(self, lora_id: int, tenant: str | None) -> None:
        if lora_id in self.held:
            return  # the same content run for two tenants holds one slot, counted once
        self.held.add(lora_id)
        if tenant is not None:
            self.by_tenant.setdefault(tenant, set()).add(lora_id)
