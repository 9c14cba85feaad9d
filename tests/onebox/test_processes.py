"""Child processes of the local stack: start-up failures show the log, stop leaves nothing."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from preft_serve.onebox.processes import Child, StackError
from tests.onebox.procs import group_members


def test_start_failure_names_the_part_and_shows_its_log(tmp_path: Path) -> None:
    script = "print('bad setting X'); raise SystemExit(3)"
    child = Child("registry", [sys.executable, "-c", script], tmp_path / "logs" / "registry.log")
    with pytest.raises(StackError) as info:
        child.wait_ready(lambda: False, timeout=30)
    message = str(info.value)
    assert "registry exited with status 3 while starting" in message
    assert str(tmp_path / "logs" / "registry.log") in message
    assert "bad setting X" in message


def test_ready_timeout_is_an_error(tmp_path: Path) -> None:
    child = Child(
        "worker", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "w.log"
    )
    try:
        with pytest.raises(StackError, match="worker was not ready after 1 s"):
            child.wait_ready(lambda: False, timeout=1, interval=0.1)
    finally:
        child.stop(5)


def test_stop_kills_a_group_that_ignores_sigterm(tmp_path: Path) -> None:
    """A child that ignores SIGTERM and has a grandchild: both are gone after stop()."""
    script = textwrap.dedent("""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        grandchild = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                       "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                       "time.sleep(300)"])
        print("grandchild", grandchild.pid, flush=True)
        time.sleep(300)
    """)
    child = Child("stubborn", [sys.executable, "-c", script], tmp_path / "s.log")
    child.wait_ready(lambda: "grandchild" in child.log_path.read_text(), timeout=30)
    assert len(group_members(child.pid)) == 2
    code = child.stop(timeout=1)
    assert code == -9
    assert group_members(child.pid) == []


def test_stop_is_graceful_when_the_child_cooperates(tmp_path: Path) -> None:
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "print('up', flush=True)\n"
        "time.sleep(300)\n"
    )
    child = Child("polite", [sys.executable, "-c", script], tmp_path / "p.log")
    child.wait_ready(lambda: "up" in child.log_path.read_text(), timeout=30)
    assert child.stop(timeout=30) == 0
    assert group_members(child.pid) == []
