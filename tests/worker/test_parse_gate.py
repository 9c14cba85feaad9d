"""The scheduler's adapter gate on its own: which waiting requests it holds back, what it
announces to the worker, and what lets a held request go (a clock stands in for time;
the real engine path is in tests/engine/test_adapter_gate.py)."""

from __future__ import annotations

import pytest

from preft_serve.worker.adapter_tiers.parse_gate import AdapterGate, SettledReport


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def gate(clock: Clock) -> AdapterGate:
    gate = AdapterGate(hold_s=2.0, clock=clock)
    gate.on_step((frozenset({1}), (), ()))  # the worker holds adapter 1
    return gate


def test_a_settled_adapter_passes_and_an_unsettled_one_is_held_and_announced_once(
    gate: AdapterGate,
) -> None:
    assert gate.admit(1, "req-1")
    assert not gate.admit(7, "req-7")
    assert not gate.admit(7, "req-7")  # a second request (or step) for the same adapter
    assert gate.take_announcements() == ["req-7"]
    assert gate.take_announcements() == []
    assert gate.held == 2


def test_a_report_that_settles_the_adapter_releases_its_requests(gate: AdapterGate) -> None:
    assert not gate.admit(7, "req-7")
    gate.on_step(None)  # nothing changed on the worker
    assert not gate.admit(7, "req-7")
    gate.on_step((frozenset({1, 7}), (), ()))
    assert gate.admit(7, "req-7")
    assert gate.released_unsettled == 0


def test_a_hold_ends_after_hold_s_whatever_the_worker_says(gate: AdapterGate, clock: Clock) -> None:
    assert not gate.admit(7, "req-7")
    clock.now += 1.9
    assert not gate.admit(7, "req-7")
    clock.now += 0.2
    assert gate.admit(7, "req-7")  # scheduled; the step loads it as stock vLLM would
    assert gate.released_unsettled == 1
    # vLLM may still skip it (no free adapter slot): it is not held a second time.
    clock.now += 0.5
    assert gate.admit(7, "req-7") and gate.released_unsettled == 1
    assert gate.take_announcements() == ["req-7"]


def test_a_hold_nobody_asks_about_is_forgotten(gate: AdapterGate, clock: Clock) -> None:
    """Its requests were cancelled: the next request for the adapter, much later, starts
    a new hold and announces the adapter again (not let through unparsed)."""
    from preft_serve.worker.adapter_tiers.parse_gate import STALE_S

    assert not gate.admit(7, "req-7")
    clock.now += STALE_S + 1
    assert not gate.admit(7, "req-7b")
    assert gate.take_announcements() == ["req-7", "req-7b"]
    assert not gate.admit(9, "req-9")  # announced
    gate.on_step((None, (9,), ()))  # the worker will not parse it ahead
    assert gate.admit(9, "req-9")
    clock.now += STALE_S + 1
    assert not gate.admit(9, "req-9b")


def test_an_adapter_the_worker_gives_up_on_is_let_through_at_once(gate: AdapterGate) -> None:
    assert not gate.admit(9, "req-9")
    gate.on_step((None, (9,), ()))  # settled set unchanged; 9 will not be parsed ahead
    assert gate.admit(9, "req-9")
    assert not gate.admit(7, "req-7")  # others are unaffected


def test_before_the_first_report_nothing_is_settled(clock: Clock) -> None:
    gate = AdapterGate(clock=clock)
    assert not gate.admit(1, "req-1")
    gate.on_step((frozenset({1}), (), ()))
    assert gate.admit(1, "req-1")


def test_a_worker_that_never_reports_turns_the_gate_off(clock: Clock) -> None:
    gate = AdapterGate(clock=clock)
    assert not gate.admit(1, "req-1")
    gate.on_step(None)
    assert gate.enabled
    gate.on_step(None)
    assert not gate.enabled
    assert gate.admit(1, "req-1") and gate.admit(2, "req-2")


def test_a_reporting_worker_may_stay_silent_while_nothing_changes(gate: AdapterGate) -> None:
    for _ in range(5):
        gate.on_step(None)
    assert gate.enabled
    assert gate.admit(1, "req-1") and not gate.admit(2, "req-2")


def test_the_worker_sends_its_settled_set_only_when_it_changed() -> None:
    report = SettledReport()
    assert report.next(frozenset({1})) == (frozenset({1}), (), ())
    assert report.next(frozenset({1})) is None
    report.give_up(5)
    assert report.next(frozenset({1})) == (None, (5,), ())
    assert report.next(frozenset({1})) is None
    assert report.next(frozenset({1, 2})) == (frozenset({1, 2}), (), ())


def test_a_hold_of_zero_turns_the_gate_off(clock: Clock) -> None:
    gate = AdapterGate(hold_s=0, clock=clock)
    gate.on_step((frozenset(), ()))
    assert gate.admit(3, "req-3")
    assert gate.take_announcements() == []


def test_worker_settings_choose_the_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    from preft_serve.worker.settings import WorkerSettings

    assert WorkerSettings().adapter_hold_ms == 2000
    monkeypatch.setenv("PREFT_WORKER_ADAPTER_HOLD_MS", "0")
    assert WorkerSettings().adapter_hold_ms == 0
    monkeypatch.setenv("PREFT_WORKER_ADAPTER_HOLD_MS", "-1")
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        WorkerSettings()


def test_a_failed_parse_is_reported_once_and_fails_its_requests() -> None:
    """Weights the worker cannot read: the scheduler must fail the adapter's requests, not
    schedule them (the step would raise inside the engine loop)."""
    report = SettledReport()
    report.fail(7)
    sent = report.next(frozenset({1}))
    assert sent == (frozenset({1}), (), (7,))
    assert report.next(frozenset({1})) is None  # reported once

    now = [0.0]
    gate = AdapterGate(hold_s=2.0, clock=lambda: now[0])
    assert not gate.admit(7, "req-7")  # announced and held while it parses
    gate.on_step(sent)
    assert gate.failed(7) and not gate.failed(1)
    assert gate.admit(1, "req-1")
    now[0] = 9.0  # past the hold timeout: still failed (the caller checks failed() first)
    assert gate.failed(7)
    now[0] = 10.5  # FAILED_S after the report: the next request tries a parse again
    assert not gate.failed(7)
    assert not gate.admit(7, "req-7b")
    assert gate.take_announcements() == ["req-7", "req-7b"]
