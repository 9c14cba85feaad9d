"""How many slots adapters applied to every token may hold (``worker.decode_slots``)."""

from __future__ import annotations

import pytest

from preft_serve.worker.decode_slots import DecodeSlots, reserved_slots
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


def test_the_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert WorkerSettings().prefill_reserved_slots is None
    monkeypatch.setenv("PREFT_WORKER_PREFILL_RESERVED_SLOTS", "2")
    assert WorkerSettings().prefill_reserved_slots == 2


def test_classic_adapters_take_slots_up_to_the_limit_and_running_ones_stay_admitted() -> None:
    slots = DecodeSlots(max_loras=4, reserved=1)
    slots.begin_step([7, 8])
    assert slots.admit(9)  # the third and last slot classic adapters may take
    assert not slots.admit(10)  # counted at once: no fourth in the same step
    assert slots.admit(7)  # a running adapter's further requests need no new slot
    assert slots.refused == 1
    slots.begin_step([8])  # two ended
    assert slots.admit(10) and slots.admit(11)
    assert not slots.admit(12)
    assert slots.refused == 2
