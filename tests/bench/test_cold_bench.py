"""The cold-adapter benchmark's arithmetic: phases, gap percentiles, ratios to warm."""

from __future__ import annotations

import pytest

from bench.cold_bench import Timeline, summarise


def test_summary_compares_cold_phases_with_the_warm_ones() -> None:
    line = Timeline()
    # Each phase lasts 10 s; streams tick every 50 ms, except one 2 s stall in store-cold.
    for phase, start, stall in (
        ("warm", 0.0, False),
        ("store-cold", 10.0, True),
        ("disk-cold", 20.0, False),
        ("warm-again", 30.0, False),
    ):
        t = start
        while t < start + 10:
            step = 2.0 if stall and abs(t - (start + 5)) < 0.01 else 0.05
            t = round(t + step, 3)
            line.tokens.append(t)
            line.gaps.append((t, step))
        line.done += [(start + 1 + i, 0.5, "ok") for i in range(5)]
        line.phases.append((phase, start, start + 10))
    rows = summarise(line)["phases"]
    assert rows["warm"]["gap_p50_ms"] == pytest.approx(50)
    assert rows["store-cold"]["gap_max_ms"] == pytest.approx(2000)
    assert rows["store-cold"]["gaps_over_2x_warm_median"] == 1
    assert rows["disk-cold"]["gaps_over_2x_warm_median"] == 0
    assert rows["disk-cold"]["gap_p99_vs_warm"] == pytest.approx(1.0)
    assert rows["store-cold"]["stream_tokens_vs_warm"] < 1.0
    assert all(r["completions"] == 5 and r["errors"] == 0 for r in rows.values())


def test_engine_steps_per_phase_against_the_warm_median() -> None:
    from bench.cold_bench import summarise_steps
    from preft_serve.worker.step_trace import Step

    line = Timeline()
    steps = []
    for phase, start in (("warm", 0.0), ("store-cold", 10.0), ("warm-again", 20.0)):
        line.phases.append((phase, start, start + 10))
        t = start
        while t < start + 9.5:
            # 20 ms decode steps; a 60 ms prefill step every second; store-cold has one
            # 200 ms decode step (an adapter copied into a slot).
            seconds = 0.06 if round(t % 1.0, 3) == 0.5 else 0.02
            adapter = 0.001
            if phase == "store-cold" and abs(t - 15.0) < 1e-6:
                seconds, adapter = 0.2, 0.15  # most of it the adapter's slot copy
            steps.append(Step(t, seconds, 40 if seconds == 0.06 else 4, 4, adapter))
            t = round(t + 0.5 if seconds == 0.06 else t + 0.25, 6)
    summary = summarise_steps(line, steps)
    assert summary["warm_median_ms"] == {"decode": pytest.approx(20), "prefill": pytest.approx(60)}
    warm, cold = summary["phases"]["warm"], summary["phases"]["store-cold"]
    assert warm["decode"]["over_2x_warm_median"] == warm["prefill"]["over_2x_warm_median"] == 0
    assert warm["prefill"]["steps"] > 0
    assert cold["decode"]["over_2x_warm_median"] == 1
    assert cold["decode"]["max_ms"] == pytest.approx(200)
    assert cold["decode"]["max_vs_warm_median"] == pytest.approx(10)
    assert cold["prefill"]["p50_ms"] == pytest.approx(60)
    assert cold["prefill"]["max_vs_warm_median"] == pytest.approx(1)
    # The trace's adapter column says the long step was adapter work, not the forward.
    assert cold["decode"]["longest_step_adapter_ms"] == cold["decode"]["adapter_max_ms"] == 150
    assert warm["decode"]["adapter_p50_ms"] == warm["decode"]["adapter_max_ms"] == 1
    decode_cold = [s for s in steps if 10 <= s.start <= 20 and s.decode_only]
    assert cold["decode"]["adapter_share"] == pytest.approx(
        sum(s.adapter_seconds or 0 for s in decode_cold) / sum(s.seconds for s in decode_cold),
        abs=1e-3,
    )
    # A trace without the column (older workers) has no adapter figures.
    old = summarise_steps(line, [Step(s.start, s.seconds, s.tokens, s.requests) for s in steps])
    assert "adapter_p50_ms" not in old["phases"]["warm"]["decode"]
