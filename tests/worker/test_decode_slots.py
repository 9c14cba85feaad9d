"""How many slots adapters applied to every token may hold, in all and per tenant
(``worker.decode_slots``)."""

from __future__ import annotations

import pytest

from preft_serve.common.tenant_xarg import TENANT_XARG, tenant_of, with_tenant
from preft_serve.worker.decode_slots import DecodeSlots, reserved_slots, tenant_slots
from preft_serve.worker.settings import WorkerSettings


@pytest.mark.parametrize(
    ("max_loras", "reserved"), [(1, 0), (2, 1), (4, 1), (7, 1), (8, 2), (32, 8)]
)
def test_by_default_a_quarter_of_the_slots_and_at_least_one_are_kept(
    max_loras: int, reserved: int
) -> None:
    assert reserved_slots(max_loras, None) == reserved


def test_a_setting_is_taken_as_it_is_and_zero_keeps_none() -> None:
    assert reserved_slots(8, 3) == 3
    assert reserved_slots(8, 0) == 0


def test_a_setting_that_leaves_classic_adapters_no_slot_is_refused() -> None:
    with pytest.raises(ValueError) as raised:
        reserved_slots(4, 4)
    message = str(raised.value)
    assert "PREFT_WORKER_PREFILL_RESERVED_SLOTS=4" in message
    assert "--max-loras is 4" in message


@pytest.mark.parametrize(
    ("classic", "setting", "share"),
    [(6, None, 3), (1, None, 1), (3, None, 1), (6, 2, 2), (6, 9, 6), (6, 0, 6)],
)
def test_a_tenants_share_is_half_by_default(classic: int, setting: int | None, share: int) -> None:
    assert tenant_slots(classic, setting) == share


def test_the_settings_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = WorkerSettings()
    assert (settings.prefill_reserved_slots, settings.tenant_classic_slots) == (None, None)
    monkeypatch.setenv("PREFT_WORKER_PREFILL_RESERVED_SLOTS", "2")
    monkeypatch.setenv("PREFT_WORKER_TENANT_CLASSIC_SLOTS", "1")
    settings = WorkerSettings()
    assert (settings.prefill_reserved_slots, settings.tenant_classic_slots) == (2, 1)


def test_classic_adapters_take_slots_up_to_the_limit_and_running_ones_stay_admitted() -> None:
    slots = DecodeSlots(limit=3, tenant_limit=3)
    slots.begin_step([(7, None), (8, None)])
    assert slots.admit(9, None)  # the third and last slot classic adapters may take
    assert not slots.admit(10, None)  # counted at once: no fourth in the same step
    assert slots.admit(7, None)  # a running adapter's further requests need no new slot
    assert slots.refused == 1
    slots.begin_step([(8, None)])  # two ended
    assert slots.admit(10, None) and slots.admit(11, None)
    assert not slots.admit(12, None)
    assert slots.refused == 2


def test_one_tenant_holds_at_most_its_share() -> None:
    slots = DecodeSlots(limit=6, tenant_limit=2)
    slots.begin_step([(1, "acme"), (2, "acme"), (3, "globex")])
    assert not slots.admit(4, "acme")  # acme holds its two
    assert slots.admit(1, "acme")  # one of them: no new slot
    assert slots.admit(4, "globex")  # globex holds one
    assert slots.admit(5, None)  # untagged requests count toward the total only
    assert slots.admit(3, "acme")  # content globex runs: shared, one slot, counted once
    assert not slots.admit(6, "globex")
    assert slots.admit(6, "initech")
    assert not slots.admit(7, "initech")  # the total: 1, 2, 3, 4, 5, 6
    assert slots.refused == 3


def test_the_gateway_names_the_tenant_and_the_worker_reads_it() -> None:
    body = {"model": "sha256:ab", "vllm_xargs": {"other": 1}}
    with_tenant(body, "acme")
    assert body["vllm_xargs"] == {"other": 1, TENANT_XARG: "acme"}
    assert tenant_of(body["vllm_xargs"]) == "acme"
    assert tenant_of(None) is None and tenant_of({TENANT_XARG: 7}) is None
