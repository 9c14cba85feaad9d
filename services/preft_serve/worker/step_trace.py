"""Engine step timestamps for benchmarks: what the engine loop itself did, step by step.

Clients cannot see engine steps: vLLM's API server merges a stream's outputs when it lags,
so inter-token gaps measured by a client hide a long step as often as they show one (see
docs/benchmarks.md, cold adapters). With ``PREFT_STEP_TRACE=FILE`` in the worker's
environment, the engine process appends one line per executed step to ``FILE``::

    <time.monotonic() at the step's start, s> <scheduled tokens> <requests> <adapter ms>

A step's duration is the time to the next line (its adapter activation, forward pass and
sampling, and the scheduling of the next step). ``adapter ms`` is the part of it spent
preparing the step's adapters before the forward pass: the token mapping, waiting for a
parse still running in the background, copying adapters into slots. It says whether a long
step was adapter work or the forward pass (a busy CPU); traces of older versions lack it.
``time.monotonic`` is the system-wide ``CLOCK_MONOTONIC`` on Linux, so a benchmark in
another process can place steps on its own timeline. Written through a buffer flushed
every ``flush_s``: off by default and a few microseconds a step when on. The hook is the
model runner's per-step adapter mapping (``vllm_compat.model_runner``), so only engines
with LoRA enabled (every preft worker) trace.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from pathlib import Path
from typing import TextIO

ENV = "PREFT_STEP_TRACE"


class StepTrace:
    """Appends step lines to a file; flushes at most every ``flush_s`` seconds."""

    def __init__(self, path: Path, flush_s: float = 0.5) -> None:
        self._file: TextIO = path.open("a", buffering=1 << 16)
        self._flush_s = flush_s
        self._next_flush = time.monotonic() + flush_s

    def mark(
        self, tokens: int, requests: int, adapter_s: float = 0.0, start: float | None = None
    ) -> None:
        """One step: started at ``start`` (default: now), ``adapter_s`` of it spent
        preparing adapters."""
        now = time.monotonic()
        start = now if start is None else start
        self._file.write(f"{start:.6f} {tokens} {requests} {1000 * adapter_s:.3f}\n")
        if now >= self._next_flush:
            self._file.flush()
            self._next_flush = now + self._flush_s

    def close(self) -> None:
        self._file.close()


def step_trace_from_env() -> StepTrace | None:
    """The trace named by ``PREFT_STEP_TRACE``, or None (the default: no tracing)."""
    path = os.environ.get(ENV)
    return StepTrace(Path(path)) if path else None


@dataclasses.dataclass(frozen=True)
class Step:
    start: float  # time.monotonic() at the step's start
    seconds: float  # to the next step's start
    tokens: int
    requests: int
    adapter_seconds: float | None = None  # None: a trace without the column

    @property
    def decode_only(self) -> bool:
        """One token per request: no prompt tokens (prefill) in the step."""
        return self.tokens == self.requests


def read_steps(path: Path) -> list[Step]:
    """The steps in a trace file, each with its duration (the last line has none and is
    dropped; so is a torn last line of a trace still being written)."""
    marks: list[tuple[float, int, int, float | None]] = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) not in (3, 4):
            continue
        try:
            adapter_s = float(fields[3]) / 1000 if len(fields) == 4 else None
            marks.append((float(fields[0]), int(fields[1]), int(fields[2]), adapter_s))
        except ValueError:
            continue
    return [
        Step(t, next_t - t, tokens, requests, adapter_s)
        for (t, tokens, requests, adapter_s), (next_t, *_) in itertools.pairwise(marks)
    ]
