"""Adapter slots: a prefill-only adapter holds one only while its prompt is computed, and
adapters applied to every token leave some for prefill-only ones and, per tenant, for
other tenants' (``decode_slots``)."""

from __future__ import annotations

import pytest

from preft_serve.common.tenant_xarg import TENANT_XARG
from preft_serve.worker.decode_slots import DecodeSlots
from tests.support.engine import MAX_LORAS, Engine, prompt, scheduler_of

DECODE_TOKENS = 24


def test_prefill_only_requests_decode_together_beyond_max_loras(engine: Engine) -> None:
    names = ["prefill-1", "prefill-2", "prefill-3", "prefill-4"]
    assert len(names) > MAX_LORAS
    engine.settle(names)  # none held back while its adapter is parsed
    outs = engine.generate(
        [prompt(200 + i, 10) for i in range(4)], [engine.lora(n) for n in names], DECODE_TOKENS
    )
    scheduled = [o.metrics.scheduled_ts for o in outs]
    finished = [o.metrics.last_token_ts for o in outs]
    # Every request started before any finished: all four decoded in one batch.
    assert max(scheduled) < min(finished)


def test_all_token_adapters_still_queue_for_slots(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vLLM's own max_loras check, without the slot kept for prefill-only adapters.
    monkeypatch.setattr(scheduler_of(engine.llm), "decode_slots", None)
    names = ["all-1", "all-2", "all-3", "all-4"]
    engine.settle(names)
    outs = engine.generate(
        [prompt(300 + i, 10) for i in range(4)], [engine.lora(n) for n in names], DECODE_TOKENS
    )
    order = sorted(outs, key=lambda o: o.metrics.scheduled_ts)
    first_wave_done = min(o.metrics.last_token_ts for o in order[:MAX_LORAS])
    # The third adapter had to wait for a slot held by a decoding request.
    assert order[MAX_LORAS].metrics.scheduled_ts >= first_wave_done


def test_classic_adapters_leave_a_slot_to_prefill_only_ones(engine: Engine) -> None:
    # Two slots, one kept from classic adapters (the default: a quarter, at least one).
    slots = scheduler_of(engine.llm).decode_slots
    assert slots is not None and slots.limit == MAX_LORAS - 1
    refused_before = slots.refused
    names = ["all-1", "all-2", "prefill-1"]
    engine.settle(names)
    long_answer, waiting_classic, prefill_only = engine.generate(
        [prompt(400 + i, 10) for i in range(3)],
        [engine.lora(n) for n in names],
        DECODE_TOKENS,
    )
    classic_done = long_answer.metrics.last_token_ts
    # Stock vLLM would run both classic adapters and hold the prefill-only request back
    # until one ended; here the second classic one waits and the prefill-only one runs.
    assert prefill_only.metrics.scheduled_ts < classic_done
    assert waiting_classic.metrics.scheduled_ts >= classic_done
    assert slots.refused > refused_before


def test_one_tenants_classic_adapters_leave_a_slot_to_another_tenant(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both slots for classic adapters, one per tenant (the engine's two slots are too few
    # for the defaults to show it: a quarter kept, half of the rest per tenant).
    slots = DecodeSlots(limit=MAX_LORAS, tenant_limit=1)
    monkeypatch.setattr(scheduler_of(engine.llm), "decode_slots", slots)
    names = ["all-1", "all-2", "all-3"]
    engine.settle(names)
    tenants = ["acme", "acme", "globex"]
    long_answer, same_tenant, other_tenant = engine.generate(
        [prompt(500 + i, 10) for i in range(3)],
        [engine.lora(n) for n in names],
        DECODE_TOKENS,
        extra_args=[{TENANT_XARG: t} for t in tenants],
    )
    held_until = long_answer.metrics.last_token_ts
    # Stock vLLM (and the total alone) would run acme's two adapters and hold globex's.
    assert other_tenant.metrics.scheduled_ts < held_until
    assert same_tenant.metrics.scheduled_ts >= held_until
    assert slots.refused > 0
