"""Parse adapters into host memory off the engine loop, ahead of their first step.

vLLM's OpenAI server calls the engine's ``add_lora`` right after a resolver finds a new
adapter; stock vLLM then reads and parses the weights inside the engine loop, so every
running request waits for it. The model runner (``vllm_compat.model_runner``) instead hands
the parse to this pool and answers at once; when the adapter's first request is scheduled,
the LoRA manager's load takes the parsed weights from here and only copies them into a slot
(``vllm_compat.lora_manager``).

Bounded: ``threads`` parses at a time, and at most ``capacity`` parsed adapters wait for
their first step (the oldest is dropped; its request then loads as stock vLLM would).
A parse that failed is reported (:meth:`AdapterPreloader.failed_ids`): the scheduler's
adapter gate fails that adapter's requests instead of scheduling them, since a step that
loaded it would raise inside the engine loop and stop the engine (stock vLLM parses in
``add_lora``, so such an adapter never got that far). Without the gate, the step loads
the adapter itself and raises there as stock vLLM would at schedule time.

Where the parse runs: vLLM's CPU worker binds its main thread (the OpenMP master) to the
compute CPUs, and every thread it starts later inherits that binding, so a plain
background thread would parse on the very core the model step runs on, stretching the step
it overlaps. Pool threads move themselves to the CPUs the process may use (its parent's)
that no compute thread holds (vLLM leaves such CPUs for the API server and engine loop:
``VLLM_CPU_NUM_OF_RESERVED_CPU``), when there are any (:func:`leave_compute_cpus`).

How the parse shares the GIL: a parse is ~10 ms of Python under the GIL, and the step
thread, which drops the GIL for every torch op, has to win it back after each op; with a
parse running it waits up to CPython's switch interval (5 ms) each time, so a step that
overlaps a parse ran ~2x as long (the convoy effect). A background parse therefore hands the
GIL back on its own every few hundred interpreter events, pausing briefly
(:class:`GilYield`): the step thread never waits more than one short slice, and the parse
takes a few times longer in the background. Once the step waits for that very parse, the
pauses stop and it finishes at full speed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

BACKGROUND_NICE = 10
"""Niceness of the threads that download and verify adapters (the resolver's): on a busy
host they yield the CPU to the engine's step threads instead of stretching every running
request's step. Nothing the engine waits for runs at this priority."""


def _process_cpus() -> frozenset[int]:
    """The CPUs this process may use, compute threads' binding aside: the parent's (vLLM's
    engine-core process, which binds nothing) and this thread's at import. The worker's own
    threads cannot say: vLLM binds them through ``OMP_PLACES``, which the OpenMP runtime
    applies to the main thread when it loads, before any plugin is imported."""
    cpus = set(os.sched_getaffinity(0))
    with contextlib.suppress(OSError):
        cpus |= os.sched_getaffinity(os.getppid())
    return frozenset(cpus)


_PROCESS_CPUS = _process_cpus()


THREAD_NAME = "preft-preload"
"""The pool threads' OS-level name (``top -H``, ``/proc/<pid>/task/*/comm``): lets tools
(the benchmarks' CPU isolation) tell them from the compute threads."""


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def leave_compute_cpus(name: str = THREAD_NAME) -> set[int] | None:
    """Move the calling thread off the CPUs it inherited from the compute threads' binding,
    onto the process's other CPUs; returns the new set (None: nothing to move to, it stays).
    Also names the thread ``name`` for the OS. Best effort: never raises."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME: this thread only
    try:
        spare = set(_PROCESS_CPUS - os.sched_getaffinity(0))
        if not spare:
            return None
        os.sched_setaffinity(0, spare)  # pid 0: the calling thread (Linux)
        return spare
    except (OSError, AttributeError):
        return None


def lower_thread_priority(nice: int = BACKGROUND_NICE) -> None:
    """Make the calling thread (only it: Linux schedules threads) nicer; best effort."""
    with contextlib.suppress(AttributeError, OSError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), nice))


@dataclasses.dataclass(frozen=True)
class GilYield:
    """Run a call so that it hands the GIL back every ``every`` profiler events (Python
    calls and returns, C calls) for ``pause_s``, until ``urgent`` is set.

    A per-thread profile hook (``sys.setprofile``, which touches only the calling thread)
    is the one place a third-party function such as vLLM's adapter parser can be made to
    yield without changing it. It never pauses inside C code, only between calls, so no
    C-level lock is held while it sleeps. Defaults, measured on SmolLM2-shaped adapters
    (``bench.experiments.preload_placement``): slices of ~0.1 ms; steps overlapping a parse went
    from ~2x to ~1.1x their usual time, the parse from ~10 to ~45 ms."""

    every: int = 200
    pause_s: float = 0.0002

    def __post_init__(self) -> None:
        if self.every < 1 or self.pause_s < 0:
            raise ValueError("every must be positive and pause_s not negative")

    def run(self, fn: Callable[[Any], Any], arg: Any, urgent: threading.Event) -> Any:
        every, pause_s, sleep = self.every, self.pause_s, time.sleep
        count = 0

        def hook(frame: FrameType, event: str, _: Any) -> None:
            nonlocal count
            count += 1
            if count < every:
                return
            count = 0
            if urgent.is_set():
                sys.setprofile(None)  # somebody waits for this result: full speed
            else:
                sleep(pause_s)  # releases the GIL; the step thread takes it at once

        sys.setprofile(hook)
        try:
            return fn(arg)
        finally:
            sys.setprofile(None)


DEFAULT_GIL_YIELD = GilYield()


class AdapterPreloader:
    """Background ``load(request)`` calls keyed by adapter id, taken once by the step."""

    def __init__(
        self,
        load: Callable[[Any], Any],
        threads: int = 1,
        capacity: int = 64,
        place_thread: Callable[[], object] | None = leave_compute_cpus,
        share_gil: GilYield | None = DEFAULT_GIL_YIELD,
    ) -> None:
        """``place_thread`` runs first in each pool thread (None: threads stay where they
        start, on the compute CPUs when started from a bound thread); ``share_gil`` paces
        background parses (None: they hold the GIL as long as CPython lets them)."""
        if threads < 1 or capacity < 1:
            raise ValueError("threads and capacity must be positive")
        self._load = load
        self._share_gil = share_gil
        self._capacity = capacity
        # How the step's loads went: "ready" (parse done), "waited" (parse still
        # running), "inline" (never parsed ahead, or failed: parsed in the step).
        self.outcomes: collections.Counter[str] = collections.Counter()
        # Normal priority: a step that needs the adapter waits for this thread, so a nicer
        # thread would be a priority inversion on a busy host.
        self._pool = ThreadPoolExecutor(
            threads, thread_name_prefix=THREAD_NAME, initializer=place_thread
        )
        self._lock = threading.Lock()
        # Each parse with the event that tells it the step now waits for it.
        self._pending: collections.OrderedDict[int, tuple[Future[Any], threading.Event]] = (
            collections.OrderedDict()
        )

    def submit(self, adapter_id: int, request: Any) -> None:
        """Start parsing ``request``'s adapter (no-op if already started)."""
        with self._lock:
            if adapter_id in self._pending:
                return
            urgent = threading.Event()
            future = (
                self._pool.submit(self._share_gil.run, self._load, request, urgent)
                if self._share_gil is not None
                else self._pool.submit(self._load, request)
            )
            self._pending[adapter_id] = (future, urgent)
            while len(self._pending) > self._capacity:
                dropped, (future, _) = self._pending.popitem(last=False)
                future.cancel()
                logger.info("adapter %d: parsed ahead but never scheduled; dropped", dropped)

    def pending(self, adapter_id: int) -> bool:
        with self._lock:
            return adapter_id in self._pending

    def pending_ids(self) -> set[int]:
        with self._lock:
            return set(self._pending)

    def settled_ids(self) -> set[int]:
        """Adapters parsed in the background, ready for a step (taking one costs the step
        no parse wait)."""
        with self._lock:
            return {
                i
                for i, (future, _) in self._pending.items()
                if future.done() and not future.cancelled() and future.exception() is None
            }

    def failed_ids(self) -> dict[int, BaseException]:
        """Adapters whose background parse raised, with the error: their requests must not
        be scheduled (the step would parse again and raise inside the engine loop)."""
        with self._lock:
            done = [
                (i, future)
                for i, (future, _) in self._pending.items()
                if future.done() and not future.cancelled()
            ]
        return {i: error for i, future in done if (error := future.exception()) is not None}

    def hurry(self, timeout_s: float) -> None:
        """No step to protect (the engine has nothing to run): let every pending parse
        run at full speed and wait up to ``timeout_s`` for one to end, so an engine loop
        that only waits for adapters does not spin."""
        with self._lock:
            running = [
                (future, urgent) for future, urgent in self._pending.values() if not future.done()
            ]
        for _, urgent in running:
            urgent.set()
        if running:
            concurrent.futures.wait(
                [f for f, _ in running],
                timeout=timeout_s,
                return_when=concurrent.futures.FIRST_COMPLETED,
            )

    def load(self, adapter_id: int, request: Any) -> Any:
        """The parsed adapter (waiting for its parse if still running), else parse now."""
        with self._lock:
            future, urgent = self._pending.pop(adapter_id, (None, None))
        if future is not None and future.cancel():
            future = None  # still queued behind other parses: parse it here, now
        if future is not None:
            assert urgent is not None
            self.outcomes["ready" if future.done() else "waited"] += 1
            urgent.set()
            try:
                return future.result()
            except Exception:
                logger.warning(
                    "adapter %d: background parse failed; loading in the step",
                    adapter_id,
                    exc_info=True,
                )
        self.outcomes["inline"] += 1
        return self._load(request)

    def discard(self, adapter_id: int) -> None:
        with self._lock:
            future, _ = self._pending.pop(adapter_id, (None, None))
        if future is not None:
            future.cancel()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
