"""Cold adapters are parsed off the engine loop: the runner's ``add_lora`` answers before
the weights are read, and the step's load takes the parsed weights (vLLM's LoRA manager
stood in for by a recorder; the real engine path runs in test_resolver's server tests)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from vllm.config.lora import LoRAConfig
from vllm.exceptions import LoRAAdapterNotFoundError
from vllm.lora.request import LoRARequest

from preft_serve.worker.adapter_tiers.background_parse import AdapterPreloader, GilYield
from preft_serve.worker.vllm_compat.lora_manager import (
    install_preloader,
    start_background_parse,
)


class RecordingManager:
    """The parts of vLLM's ``LRUCacheWorkerLoRAManager`` the seam uses."""

    def __init__(self, max_lora_rank: int = 16) -> None:
        self.lora_config = LoRAConfig(max_lora_rank=max_lora_rank, max_cpu_loras=4)
        self.max_position_embeddings = 4096
        self.release = threading.Event()
        self.parses: list[tuple[int, str]] = []  # (adapter id, thread name)
        self.fail_next = 0
        self.loaded: set[int] = set()

    def _load_adapter(self, request: LoRARequest) -> str:
        self.parses.append((request.lora_int_id, threading.current_thread().name))
        assert self.release.wait(10), "parse never released"
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("bad tensors")
        return f"parsed-{request.lora_int_id}"

    def list_adapters(self) -> set[int]:
        return set(self.loaded)


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll until ``condition()`` (the pool thread starts work after its placement)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.005)


def adapter(tmp_path: Path, name: str, rank: int = 8) -> LoRARequest:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": rank,
                "lora_alpha": 16,
                "target_modules": ["q_proj"],
                "bias": "none",
            }
        )
    )
    return LoRARequest(lora_name=name, lora_int_id=len(name), lora_path=str(folder))


def test_add_lora_answers_before_the_parse_and_the_step_takes_the_parsed_weights(
    tmp_path: Path,
) -> None:
    manager = RecordingManager()
    install_preloader(manager)
    request = adapter(tmp_path, "cold")

    assert start_background_parse(manager, request)  # returns while the parse is still blocked
    assert not manager.release.is_set()
    wait_until(lambda: len(manager.parses) == 1)  # the pool thread has started it
    manager.release.set()
    assert manager._load_adapter(request) == "parsed-4"  # what the step calls
    assert len(manager.parses) == 1  # parsed once, in the background, not in the step
    assert manager.parses[0][1].startswith("preft-preload")
    assert manager._load_adapter(request) == "parsed-4"  # later loads: stock behaviour
    assert [thread for _, thread in manager.parses][1] == threading.current_thread().name


def test_stock_path_for_adapters_already_in_host_memory(tmp_path: Path) -> None:
    manager = RecordingManager()
    install_preloader(manager)
    request = adapter(tmp_path, "warm")
    manager.loaded.add(request.lora_int_id)
    assert not start_background_parse(manager, request)  # vLLM just touches its LRU entry
    assert not start_background_parse(RecordingManager(), request)  # no preloader installed
    assert manager.parses == []


def test_what_stock_vllm_refuses_at_once_is_still_refused_at_once(tmp_path: Path) -> None:
    manager = RecordingManager(max_lora_rank=8)
    install_preloader(manager)
    with pytest.raises(ValueError, match="greater than max_lora_rank"):
        start_background_parse(manager, adapter(tmp_path, "wide", rank=16))
    missing = LoRARequest(lora_name="gone", lora_int_id=9, lora_path=str(tmp_path / "nope"))
    with pytest.raises(LoRAAdapterNotFoundError):
        start_background_parse(manager, missing)
    assert manager.parses == []


def test_a_failed_background_parse_is_retried_in_the_step(tmp_path: Path) -> None:
    manager = RecordingManager()
    install_preloader(manager)
    request = adapter(tmp_path, "flaky")
    manager.fail_next = 1
    manager.release.set()
    assert start_background_parse(manager, request)
    wait_until(lambda: len(manager.parses) == 1)  # the background parse ran (and failed)
    assert manager._load_adapter(request) == "parsed-5"
    assert len(manager.parses) == 2
    manager.fail_next = 2
    assert start_background_parse(manager, request)
    wait_until(lambda: len(manager.parses) == 3)
    with pytest.raises(RuntimeError, match="bad tensors"):  # as stock vLLM would raise
        manager._load_adapter(request)


def test_preloader_is_bounded() -> None:
    release = threading.Event()
    running: list[int] = []

    def parse(n: int) -> int:
        running.append(n)
        release.wait(10)
        return n * 10

    preloader = AdapterPreloader(parse, threads=1, capacity=2)
    preloader.submit(1, 1)
    wait_until(lambda: running == [1])  # running in the pool thread, so it cannot be cancelled
    for n in (2, 3):
        preloader.submit(n, n)
    preloader.submit(3, 3)  # already started: no second parse
    assert preloader.pending_ids() == {2, 3}  # the oldest was dropped
    release.set()
    assert [preloader.load(n, n) for n in (2, 3, 1)] == [20, 30, 10]
    assert sorted(running) == [1, 1, 2, 3]  # 1 parsed in the background, then in load()
    preloader.close()


def test_engine_paths_are_untouched_for_relative_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stock vLLM resolves relative paths (possibly from a model hub): left to it."""
    manager = RecordingManager()
    install_preloader(manager)
    request = adapter(tmp_path, "rel")
    monkeypatch.chdir(tmp_path)
    relative = LoRARequest(lora_name="rel", lora_int_id=3, lora_path="rel")
    assert not start_background_parse(manager, relative)
    assert start_background_parse(manager, request)
    manager.release.set()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_parse_threads_leave_the_compute_cpu_their_creator_was_bound_to() -> None:
    """vLLM binds the worker's main thread to the compute CPUs and threads it starts
    inherit that; the parse must not run on the core the model step runs on."""
    everything = os.sched_getaffinity(0)
    compute = {min(everything)}
    seen: dict[str, object] = {}
    parsed = threading.Event()

    def parse(request: object) -> str:
        seen["cpus"] = os.sched_getaffinity(0)
        tid = threading.get_native_id()
        seen["name"] = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        parsed.set()
        return "parsed"

    os.sched_setaffinity(0, compute)  # as vLLM's init_device binds the main thread
    try:
        preloader = AdapterPreloader(parse)
        preloader.submit(1, "request")  # the pool's thread starts here, bound like us
        assert parsed.wait(10)  # in the background, not in load() below
        assert preloader.load(1, "request") == "parsed"
        preloader.close()
    finally:
        os.sched_setaffinity(0, everything)
    assert seen["cpus"] == everything - compute
    assert seen["name"] == "preft-preload"


def test_an_unbound_creator_leaves_the_thread_where_it_is() -> None:
    seen: list[set[int]] = []
    parsed = threading.Event()

    def parse(request: object) -> None:
        seen.append(os.sched_getaffinity(0))
        parsed.set()

    preloader = AdapterPreloader(parse)
    preloader.submit(1, "request")
    assert parsed.wait(10)
    preloader.load(1, "request")
    preloader.close()
    assert seen == [os.sched_getaffinity(0)]


def busy_python(n: int) -> int:
    """Pure-Python work that holds the GIL (as vLLM's adapter parse does)."""
    total = 0
    for i in range(n):
        total += abs(i % 7 - 3)
    return total


def test_a_yielding_call_pauses_once_every_every_profile_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hand-back is a sleep (which releases the GIL) after every ``every`` profile
    events, counted exactly; how short the step thread's waits become is a measurement,
    made by ``bench.experiments.preload_placement``, not a timed test."""
    pauses: list[float] = []
    monkeypatch.setattr(time, "sleep", pauses.append)
    urgent = threading.Event()
    GilYield(every=1, pause_s=0.0002).run(busy_python, 2000, urgent)
    events = len(pauses)  # one pause per event
    pauses.clear()
    GilYield(every=50, pause_s=0.0002).run(busy_python, 2000, urgent)
    assert events > 1000
    assert len(pauses) == events // 50 and set(pauses) == {0.0002}


def test_a_yielding_call_returns_its_result_and_raises_its_errors() -> None:
    urgent = threading.Event()
    share = GilYield(every=10, pause_s=0.0)
    assert share.run(busy_python, 1000, urgent) == busy_python(1000)
    assert sys.getprofile() is None  # the hook is gone after the call

    def bad(_: object) -> None:
        raise ValueError("bad tensors")

    with pytest.raises(ValueError, match="bad tensors"):
        share.run(bad, None, urgent)
    assert sys.getprofile() is None


@pytest.mark.parametrize("every,pause_s", [(0, 0.001), (10, -1.0)])
def test_gil_yield_refuses_nonsense(every: int, pause_s: float) -> None:
    with pytest.raises(ValueError, match="every must be positive"):
        GilYield(every=every, pause_s=pause_s)


def test_once_the_step_waits_for_a_parse_it_stops_pausing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A parse that pauses 10 ms after every profile event (over 1,000 pauses in all) stops
    pausing once ``load`` waits for it: the step never waits out the pacing. The pauses are
    counted, not timed."""
    pauses: list[float] = []
    sleep = time.sleep

    def counted_sleep(seconds: float) -> None:
        if threading.current_thread().name.startswith("preft-preload"):
            pauses.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", counted_sleep)
    parsed_by: list[str] = []
    started = threading.Event()

    def parse(n: int) -> int:
        started.set()
        parsed_by.append(threading.current_thread().name)
        return busy_python(n)

    preloader = AdapterPreloader(
        parse, place_thread=None, share_gil=GilYield(every=1, pause_s=0.01)
    )
    preloader.submit(1, 2000)
    assert started.wait(10)
    before = len(pauses)
    assert preloader.load(1, 2000) == busy_python(2000)
    assert len(pauses) - before < 50  # paced to the end, it would pause over 1,000 times
    assert parsed_by == ["preft-preload_0"]  # parsed in the background, not again in load()
    preloader.close()


def test_worker_settings_choose_the_gil_pacing(monkeypatch: pytest.MonkeyPatch) -> None:
    from preft_serve.worker.settings import WorkerSettings

    assert WorkerSettings().preload_share_gil() == GilYield(pause_s=0.0002)
    monkeypatch.setenv("PREFT_WORKER_PRELOAD_PAUSE_US", "0")
    assert WorkerSettings().preload_share_gil() is None
    monkeypatch.setenv("PREFT_WORKER_PRELOAD_PAUSE_US", "50000")
    with pytest.raises(ValueError, match="less than or equal to 10000"):
        WorkerSettings()


def test_settled_ids_are_the_parses_that_ended_and_hurry_unpaces_them() -> None:
    release = threading.Event()

    def parse(n: int) -> int:
        if n == 1:
            release.wait(10)
        return busy_python(20_000)

    # Paced so hard (10 ms every event) that only hurry() can finish parse 2 in time.
    preloader = AdapterPreloader(
        parse, threads=2, place_thread=None, share_gil=GilYield(every=1, pause_s=0.01)
    )
    preloader.submit(1, 1)
    preloader.submit(2, 2)
    assert preloader.settled_ids() == set()
    # Returns once one parse ended: 2 (1 waits for release); paced, 2 would take minutes.
    preloader.hurry(timeout_s=60)
    assert preloader.settled_ids() == {2}
    release.set()
    wait_until(lambda: preloader.settled_ids() == {1, 2})
    assert preloader.load(2, 2) == busy_python(20_000)
    assert preloader.outcomes["ready"] == 1
    preloader.close()


def test_announced_adapters_are_parsed_ahead_and_reported_settled(tmp_path: Path) -> None:
    """The runner's side of the scheduler's adapter gate."""
    from preft_serve.worker.vllm_compat.model_runner import PreftLoRAMappingMixin

    runner = PreftLoRAMappingMixin()
    manager = RecordingManager()
    manager.loaded = {40}
    runner.lora_manager = manager  # type: ignore[attr-defined]
    install_preloader(manager)
    assert runner.adapter_report() == (frozenset({40}), (), ())
    assert runner.adapter_report() is None  # nothing changed

    on_disk = adapter(tmp_path, "evicted")  # id 7
    relative = LoRARequest(lora_name="hub", lora_int_id=8, lora_path="org/hub-adapter")
    runner.start_background_parses([on_disk, relative])
    wait_until(lambda: len(manager.parses) == 1)  # the background parse of 7 started
    assert manager.parses[0][1].startswith("preft-preload")
    # 8 is left to stock vLLM (it may fetch it from a hub): its requests go at once.
    assert runner.adapter_report() == (None, (8,), ())
    manager.release.set()
    wait_until(lambda: runner.adapter_report() == (frozenset({40, 7}), (), ()))
    runner.start_background_parses([on_disk])  # announced again: the parse is not repeated
    assert manager._load_adapter(on_disk) == "parsed-7"
    assert len(manager.parses) == 1


def test_a_failed_background_parse_is_reported_failed_not_settled(tmp_path: Path) -> None:
    """Weights that cannot be read: the runner reports the adapter failed (once), never
    settled, so the scheduler fails its requests instead of letting a step parse it again
    and raise inside the engine loop."""
    from preft_serve.worker.vllm_compat.model_runner import PreftLoRAMappingMixin

    runner = PreftLoRAMappingMixin()
    manager = RecordingManager()
    manager.fail_next = 1
    manager.release.set()
    runner.lora_manager = manager  # type: ignore[attr-defined]
    preloader = install_preloader(manager)
    broken = adapter(tmp_path, "broken")  # id 6
    runner.start_background_parses([broken])
    wait_until(lambda: preloader.failed_ids() != {})
    assert isinstance(preloader.failed_ids()[6], RuntimeError)
    assert 6 not in preloader.settled_ids()
    assert runner.adapter_report() == (frozenset(), (), (6,))
    assert runner.adapter_report() is None  # reported once
    assert not preloader.pending(6)  # dropped: a later request parses it anew
    gone = adapter(tmp_path, "gone-dir")  # id 8
    (Path(gone.lora_path) / "adapter_config.json").unlink()
    runner.start_background_parses([gone])  # cannot start: failed at once, nothing parsed
    assert runner.adapter_report() == (None, (), (8,))


def test_an_in_place_reload_never_gets_the_old_parse(tmp_path: Path) -> None:
    """``load_inplace`` (new weights under an id) while the old weights are still parsed
    ahead: the reload must parse anew, not take the pending parse of the old ones."""
    from preft_serve.worker.vllm_compat.model_runner import PreftLoRAMappingMixin

    class StockRunner:
        lora_manager: RecordingManager

        def add_lora(self, request: LoRARequest) -> bool:  # vLLM's: loads via the manager
            self.lora_manager._load_adapter(request)
            return True

    class Runner(PreftLoRAMappingMixin, StockRunner):
        pass

    runner = Runner()
    manager = RecordingManager()
    runner.lora_manager = manager
    install_preloader(manager)
    old = adapter(tmp_path, "inplace")
    (Path(old.lora_path) / "adapter_model.safetensors").write_bytes(b"old weights")
    assert runner.add_lora(old)
    wait_until(lambda: len(manager.parses) == 1)  # the old weights, parsing ahead
    manager.release.set()
    new = LoRARequest(
        lora_name="inplace", lora_int_id=old.lora_int_id, lora_path=old.lora_path, load_inplace=True
    )
    assert runner.add_lora(new)
    assert len(manager.parses) == 2  # parsed anew ...
    assert manager.parses[1][1] == threading.current_thread().name  # ... by the reload
