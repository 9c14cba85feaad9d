"""Hold a waiting request back until the worker holds its adapter's weights in memory.

The worker parses adapters off the engine loop (``background_parse.py``), but only those
it is told about: a new adapter through ``add_lora``, which the server calls once per
adapter. An adapter the worker later evicted from host memory (more adapters in use than
``--max-cpu-loras``) is not new to the server, so without the gate its next request would
be scheduled at once and the step that ran it would parse the weights inline, stalling
every running request; and a request whose adapter was still parsing would make its first
step wait for the parse.

:class:`AdapterGate` lives in the scheduler (engine-core process). Each step the worker
reports which adapter ids it can run without parsing (in host memory, or parsed ahead:
"settled"). A waiting request whose adapter is not settled is announced to the worker
once (the next step's scheduler output carries it; the worker starts a background
parse) and skipped by the scheduler until a report says it is settled, or ``hold_s``
passed (then it is scheduled anyway and the step parses as stock vLLM would: a failed or
dropped parse never holds a request for ever). Running requests keep their steps the
whole time. A hold that ran out stays open until the adapter settles (a request vLLM then
skips for another reason is not held twice); one no request asked about for ``STALE_S``
is forgotten. A worker that never reports (not this project's worker class) turns the gate
off after two steps; until its first report the gate treats no adapter as settled.

An adapter whose background parse failed (weights vLLM cannot read: a broken safetensors
file, modules the model lacks, a directory that is gone...) is reported as failed; its
requests are then failed (:meth:`AdapterGate.failed`: the scheduler finishes them with an
error) rather than scheduled, because the step would parse it again and raise inside the
engine loop, which stops the engine for every tenant. The mark lasts ``FAILED_S``; the
next request after that is announced again and parsed again (a failure may have been
passing: a directory being fetched again, memory).

Pure book-keeping, no vLLM import: ``vllm_compat.scheduler``, ``.workers`` and
``.model_runner`` wire it in.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

logger = logging.getLogger(__name__)

Report = tuple[frozenset[int] | None, tuple[int, ...], tuple[int, ...]]
"""What the worker sends after a step: (settled set or None if unchanged, given up,
failed)."""

HOLD_S = 2.0
"""Longest a request waits for its adapter's background parse before it is scheduled
anyway; a parse of a real model's adapter takes tens of ms (SmolLM2: ~10 ms, ~45 ms
with the GIL pacing of ``preload.GilYield``)."""


FAILED_S = 10.0
"""How long requests for an adapter whose parse failed are failed at once, before the
next one tries a parse again."""


STALE_S = 10.0
"""A hold no request has asked about for this long is forgotten (its requests were
cancelled): the next request for the adapter starts a new one, announced again."""


@dataclasses.dataclass
class _Hold:
    """One adapter's requests held for its parse."""

    first: float  # when it was announced
    last: float  # when a waiting request last asked
    released: bool = False  # the hold ran out, or the worker gave up: requests pass


class AdapterGate:
    """Which adapters the worker can run without parsing, and the requests held for one."""

    def __init__(self, hold_s: float = HOLD_S, clock: Callable[[], float] = time.monotonic) -> None:
        """``hold_s`` 0: never hold (the gate is off)."""
        self._hold_s = hold_s
        self._clock = clock
        self._settled: frozenset[int] = frozenset()
        self._heard = False  # a report has come
        self._silent_steps = 0  # steps without one, before the first
        self.enabled = hold_s > 0
        self._holds: dict[int, _Hold] = {}  # adapter id -> its hold
        self._failed: dict[int, float] = {}  # adapter id -> when its parse failed
        self._to_announce: list[Any] = []
        self.held = 0  # scheduler skips so far (each waiting request, each step)
        self.released_unsettled = 0  # requests scheduled when their hold ran out

    def admit(self, lora_id: int, lora_request: Any) -> bool:
        """May a waiting request for adapter ``lora_id`` be scheduled in this step?"""
        if not self.enabled or lora_id in self._settled:
            return True
        now = self._clock()
        hold = self._holds.get(lora_id)
        if hold is None or now - hold.last > STALE_S:
            self._holds[lora_id] = _Hold(now, now)
            self._to_announce.append(lora_request)
            self.held += 1
            return False
        hold.last = now
        if hold.released:
            # Until the adapter settles: a request vLLM skipped for other reasons after
            # its hold ran out (no free adapter slot, KV blocks) is not held again.
            return True
        if now - hold.first >= self._hold_s:
            hold.released = True
            self.released_unsettled += 1
            return True
        self.held += 1
        return False

    def failed(self, lora_id: int) -> bool:
        """Must a request for adapter ``lora_id`` be failed (its weights could not be
        read less than ``FAILED_S`` ago)?"""
        since = self._failed.get(lora_id)
        if since is None:
            return False
        if self._clock() - since < FAILED_S:
            return True
        del self._failed[lora_id]  # try again: the request is announced and parsed anew
        return False

    def take_announcements(self) -> list[Any]:
        """The adapters to announce with this step's scheduler output (each once)."""
        out, self._to_announce = self._to_announce, []
        return out

    def on_step(self, report: Report | None) -> None:
        """After each step, with the worker's report if it sent one (None: nothing
        changed since its last report)."""
        if report is not None:
            self._heard = True
            self.on_report(*report)
        elif not self._heard and self.enabled:  # (off: nothing to warn about)
            self._silent_steps += 1
            if self._silent_steps >= 2:
                self.enabled = False
                self._holds.clear()
                logger.warning(
                    "the worker does not report which adapters it holds; "
                    "requests are no longer held for their adapter's parse"
                )

    def on_report(
        self, settled: Iterable[int] | None, give_up: Iterable[int] = (), failed: Iterable[int] = ()
    ) -> None:
        """The worker's report after a step: the settled set (None: unchanged since its
        last one), announced adapters it will not parse ahead (a path stock vLLM must
        resolve itself...): their requests are scheduled at once, to be loaded there; and
        adapters whose parse failed: their requests are failed from now on."""
        for lora_id in failed:
            self._failed[lora_id] = self._clock()
            self._holds.pop(lora_id, None)
        if settled is not None:
            self._settled = frozenset(settled)
            for lora_id in self._settled.intersection(self._holds):
                del self._holds[lora_id]
        for lora_id in give_up:
            if (hold := self._holds.get(lora_id)) is not None:
                hold.released = True  # the next admit lets it through


class SettledReport:
    """Worker side: what to send after a step, None when nothing changed (the scheduler
    keeps the last settled set), so a steady state costs one comparison per step."""

    def __init__(self) -> None:
        self._last: frozenset[int] | None = None
        self._give_up: list[int] = []
        self._failed: list[int] = []

    def give_up(self, lora_id: int) -> None:
        self._give_up.append(lora_id)

    def fail(self, lora_id: int) -> None:
        """Report that ``lora_id`` cannot be parsed (its requests are to fail)."""
        self._failed.append(lora_id)

    def next(self, settled: frozenset[int]) -> Report | None:
        changed = settled != self._last
        if not changed and not self._give_up and not self._failed:
            return None
        self._last = settled
        give_up, self._give_up = tuple(self._give_up), []
        failed, self._failed = tuple(self._failed), []
        return (settled if changed else None), give_up, failed
