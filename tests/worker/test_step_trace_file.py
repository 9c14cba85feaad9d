"""The step-trace file: written as steps happen, read back as steps with durations."""

from __future__ import annotations

from pathlib import Path

import pytest

from preft_serve.worker.step_trace import ENV, StepTrace, read_steps, step_trace_from_env


def test_trace_is_off_unless_the_environment_names_a_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert step_trace_from_env() is None
    monkeypatch.setenv(ENV, str(tmp_path / "t.txt"))
    trace = step_trace_from_env()
    assert trace is not None
    trace.mark(5, 1, adapter_s=0.0125, start=42.0)
    trace.close()
    assert (tmp_path / "t.txt").read_text().split() == ["42.000000", "5", "1", "12.500"]


def test_steps_last_until_the_next_mark_and_torn_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("10.0 64 2\n10.5 2 2\n10.6 2 2\n11.6 3 3\n12.0 1")  # last line torn
    steps = read_steps(path)
    assert [(s.start, round(s.seconds, 6), s.tokens, s.requests) for s in steps] == [
        (10.0, 0.5, 64, 2),
        (10.5, 0.1, 2, 2),
        (10.6, 1.0, 2, 2),
    ]
    assert [s.decode_only for s in steps] == [False, True, True]
    assert all(s.adapter_seconds is None for s in steps)  # a trace without the column


def test_the_adapter_time_column_is_read_back_in_seconds(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    trace = StepTrace(path)
    trace.mark(64, 2, adapter_s=0.004, start=10.0)
    trace.mark(2, 2, adapter_s=0.0, start=10.25)
    trace.mark(2, 2, start=10.3)
    trace.close()
    steps = read_steps(path)
    assert [(s.start, round(s.seconds, 6), s.adapter_seconds) for s in steps] == [
        (10.0, 0.25, 0.004),
        (10.25, 0.05, 0.0),
    ]


def test_lines_reach_the_file_while_the_engine_runs(tmp_path: Path) -> None:
    """A benchmark reads the trace of a worker it is about to stop: buffered lines must
    not wait for close."""
    path = tmp_path / "t.txt"
    trace = StepTrace(path, flush_s=0.0)
    trace.mark(8, 1)
    trace.mark(1, 1)
    assert len(path.read_text().splitlines()) == 2
    trace.close()
