"""Workers' pauses, measured from their engines' step traces (``PREFT_STEP_TRACE``).

Two workers on the 2-core VM share it with the gateway, Redis, the registry and locust's
50 users, and now and then one engine gets no CPU for a while: a step that would take
milliseconds takes a second or more. While it lasts the worker finishes nothing, its
in-flight count climbs to the gateway's bounded-load cap, and the gateway spills its
adapters to the other worker, cold there. The two engines compete for the same cores, so
their pauses fall less often together than chance would have them: replaying each worker's
measured pauses at their measured times keeps that, a random process would not. The
simulator's step model gives every step its token cost at one speed (``phase``); the pauses
are what it leaves out:

* a **long step** is one longer than :data:`LONG_STEP_S`, 250 ms: longer than every step
  of the one-worker load tests' traces (204 and 233 ms at most), which the simulator
  matches without pauses; a **pause** is a run of consecutive long steps;
* it starts where the run starts and lasts the run's duration less a median step per step
  in it (the work done).

:func:`steps_file` keeps each traced worker's steps of the load test's window (one row per
step: duration in ms, scheduled tokens, requests) next to its summary, ``<out>_steps.json``,
with the workers' mean object-store fetch in the window (their
``preft_worker_adapter_load_seconds{tier=disk}``: a download and its hash check). Where it is
recorded the simulator fetches in that time (:func:`fetch_time`), not in the profile's
times the phase: fetches run in the API server's threads, and on this VM their time does
not follow the engine's (39 ms in the traced two-worker run, against 160 ms that the phase
fitted on its throughput would give them).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.scale_sim.model import Lognormal, Pauses, Profile
from preft_serve.worker.step_trace import Step

LONG_STEP_S = 0.25


def measure(first_s: float, durations: list[float]) -> tuple[tuple[float, float], ...]:
    """One worker's pauses: its first step at ``first_s`` s into the run, then each step's
    duration in order."""
    median = float(np.median(durations)) if durations else 0.0
    pauses: list[tuple[float, float]] = []
    t, start, lost = first_s, 0.0, 0.0
    for d in [*durations, 0.0]:
        if d > LONG_STEP_S:
            start = t if not lost else start
            lost += d - median
        elif lost:
            pauses.append((round(start, 4), round(start + lost, 4)))
            lost = 0.0
        t += d
    return tuple(pauses)


def load(summary: Path) -> tuple[Pauses | None, float | None]:
    """The pauses and the mean fetch (s) recorded beside a load-test summary
    (``<out>_steps.json``), each None where not recorded."""
    path = summary.with_name(summary.name.replace("_summary.json", "_steps.json"))
    if not path.exists():
        return None, None
    data = json.loads(path.read_text())
    pauses = Pauses(
        tuple(
            measure(w["first_s"], [row[0] / 1000 for row in w["steps"]]) for w in data["workers"]
        ),
        path.name,
    )
    fetch = data["fetch_ms_mean"] / 1000 if data.get("fetches") else None
    return pauses, fetch


def fetch_time(profile: Profile, mean_s: float | None) -> Profile:
    """``profile`` with its fetch time's shape and the measured mean (unchanged if None)."""
    if mean_s is None:
        return profile
    k = mean_s / profile.fetch_s.mean()
    return replace(profile, fetch_s=Lognormal(profile.fetch_s.p50 * k, profile.fetch_s.p90 * k))


def summary(pauses: Pauses, span_s: float) -> dict[str, Any]:
    """What the pauses amount to: how many, how long, how much of the run, how often
    two workers paused at once against chance."""
    lengths = [b - a for w in pauses.workers for a, b in w]
    grid = np.arange(0.0, span_s, 0.01)
    masks = []
    for w in pauses.workers:
        mask = np.zeros(len(grid), bool)
        for a, b in w:
            mask[(grid >= a) & (grid < b)] = True
        masks.append(mask)
    out: dict[str, Any] = {
        "source": pauses.source,
        "pauses": len(lengths),
        "mean_ms": round(1000 * float(np.mean(lengths)), 1) if lengths else 0.0,
        "max_ms": round(1000 * max(lengths), 1) if lengths else 0.0,
        "paused_share": [round(float(m.mean()), 3) for m in masks],
    }
    if len(masks) == 2:
        out["both_paused_share"] = round(float((masks[0] & masks[1]).mean()), 3)
        out["both_if_independent"] = round(float(masks[0].mean() * masks[1].mean()), 3)
    return out


def steps_file(
    traces: dict[str, list[Step]], fetches: tuple[float, int], start: float, end: float, what: str
) -> dict[str, Any]:
    """``<out>_steps.json``: each traced worker's steps begun in ``[start, end)``
    (``start``: the run's first request, on the traces' clock), and the workers' fetches
    in it (mean ms, count)."""
    workers = []
    for name, steps in traces.items():
        kept = [s for s in steps if start <= s.start < end]
        workers.append(
            {
                "name": name,
                "first_s": round(kept[0].start - start, 4) if kept else 0.0,
                "steps": [[round(1000 * s.seconds, 2), s.tokens, s.requests] for s in kept],
            }
        )
    return {
        "what": what,
        "span_s": round(end - start, 3),
        "fetch_ms_mean": round(fetches[0], 1),
        "fetches": fetches[1],
        "columns": ["duration_ms", "tokens", "requests"],
        "workers": workers,
    }
