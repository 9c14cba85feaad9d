"""The placement benchmark's summary: steps split by whether a parse overlapped them, and
the step time the parses cost in all (synthetic rounds, numbers worked out by hand)."""

from __future__ import annotations

import pytest

from bench.experiments.preload_placement import summarise


def _round(placement: str, steps: list[tuple[float, bool]], parses: list[float]) -> dict:
    return {
        "placement": placement,
        "steps": [(i * 0.1, s, p) for i, (s, p) in enumerate(steps)],
        "parse_s": parses,
    }


def test_summary_splits_steps_by_overlap_and_counts_the_time_parses_cost() -> None:
    rounds = [
        # inherit: idle steps of 10 ms; two parses overlapping steps of 30 and 20 ms
        _round(
            "inherit",
            [(0.010, False), (0.010, False), (0.030, True), (0.020, True)],
            [0.020, 0.015],
        ),
        # spare: idle 10 ms; one parse overlapping one 12 ms step
        _round("spare", [(0.010, False), (0.012, True), (0.010, False)], [0.008]),
        # spare+paced: idle 10 ms; one long parse overlapping three steps of 11 ms
        _round(
            "spare+paced", [(0.010, False), (0.011, True), (0.011, True), (0.011, True)], [0.040]
        ),
    ]
    summary = summarise(rounds)
    paced = summary["spare+paced"]
    assert paced["during_vs_no_parse_p50"] == pytest.approx(1.1)
    assert paced["during_parse_over_2x"] == 0
    assert paced["lost_step_ms_per_parse"] == pytest.approx(3.0)
    assert paced["parse_ms_p50"] == 40.0
    inherit, spare = summary["inherit"], summary["spare"]
    assert inherit["no_parse_p50_ms"] == 10.0
    assert inherit["steps_during_parse"] == 2
    assert inherit["during_parse_over_2x"] == 1  # the 30 ms step; 20 ms is not over 2x
    assert inherit["lost_step_ms_per_parse"] == pytest.approx((20 + 10) / 2)
    assert inherit["during_vs_no_parse_p50"] == pytest.approx(2.5)
    assert spare["lost_step_ms_per_parse"] == pytest.approx(2.0)
    assert spare["parse_ms_p50"] == 8.0


def test_a_placement_without_rounds_is_left_out() -> None:
    summary = summarise([_round("spare", [(0.010, False), (0.012, True)], [0.008])])
    assert set(summary) == {"spare"}
