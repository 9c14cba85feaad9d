"""The soak's readings of /proc: trainer processes and part samples survive the processes
around them (another test's trainer, a process that became a zombie since it was listed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.soak import processes
from bench.soak.finetune import TRAINER_MODULE, trainers
from bench.soak.journal import Journal

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)", TRAINER_MODULE.decode()]


@pytest.fixture
def spawn() -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen(argv, env=env))
        return started[-1]

    yield start
    for proc in started:
        proc.kill()
        proc.wait(10)


def test_trainers_are_the_soaks_own_jobs_and_skip_those_without_a_spec(spawn: Any) -> None:
    """A process running the trainer module without a spec (another test's) and a trainer
    of a job the soak does not know are both left out; the soak's own trainer is found."""
    spec = "PREFT_TRAINER_SPEC"
    bare = spawn(SLEEPER, {k: v for k, v in os.environ.items() if k != spec})
    ours = spawn(SLEEPER, {**os.environ, spec: json.dumps({"job_id": "ftjob-soak"})})
    other = spawn(SLEEPER, {**os.environ, spec: json.dumps({"job_id": "ftjob-other"})})
    time.sleep(0.5)  # the children have exec'd: /proc shows their command line
    found = trainers({"ftjob-soak": {}})
    assert found.get(ours.pid) == "ftjob-soak"
    assert bare.pid not in found and other.pid not in found


def test_sample_tolerates_a_process_that_became_a_zombie(
    spawn: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group member listed live and reaped-to-zombie before its status is read (a part
    chaos just killed) counts 0 MB; the part's other processes are still summed."""
    zombie = spawn([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert "VmRSS:" not in Path(f"/proc/{zombie.pid}/status").read_text()
    monkeypatch.setattr(processes, "group_pids", lambda _pgid: [zombie.pid, os.getpid()])
    journal = Journal()
    stack: Any = SimpleNamespace(parts={"gateway": SimpleNamespace(pid=0, incarnation=1)})
    processes.sample(stack, journal)
    part = journal.samples[0]["parts"]["gateway"]
    assert part["rss_mb"] > 0 and part["fds"] > 0
