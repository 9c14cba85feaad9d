"""One managed child process: started with its log in a file, waited for, stopped for sure.

Each child runs in its own session (process group), for two reasons: a Ctrl-C in the
terminal reaches only the local stack, which then stops the children in order instead of
all at once; and stopping signals the whole group, so processes a child started itself
(vLLM's engine core) go too. On Linux a child also gets SIGTERM if the stack dies without
cleaning up (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1


class StackError(RuntimeError):
    """A part of the stack failed; the message says which and shows its log tail."""


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up here, not in the forked child, so the child takes no loader or import locks.
_PRCTL = _load_prctl()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Child:
    """A named subprocess whose stdout and stderr go to ``log_path``."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name, self.argv, self.log_path = name, list(argv), log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 (no locks: see _PRCTL)
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.rstrip().splitlines()[-lines:]) or "(empty log)"

    def failure(self, what: str) -> StackError:
        return StackError(f"{self.name} {what}; last lines of {self.log_path}:\n{self.log_tail()}")

    def wait_ready(
        self, check: Callable[[], bool], timeout: float, interval: float = 0.25
    ) -> float:
        """Poll ``check`` until it is true; return the seconds waited.

        Raises :class:`StackError` with the log tail if the child exits or time runs out.
        """
        start = time.monotonic()
        while True:
            if not self.running():
                raise self.failure(f"exited with status {self.proc.returncode} while starting")
            with contextlib.suppress(Exception):
                if check():
                    return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise self.failure(f"was not ready after {timeout:.0f} s")
            time.sleep(interval)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM the child's process group, wait, then SIGKILL it; return the exit code."""
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            code = self.proc.wait(10)
        # Give what the leader started (vLLM's engine core) the rest of the time, then
        # remove whatever is left in the group.
        while self._group_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._group_alive():
            self._signal_group(signal.SIGKILL)
            # SIGKILL is not instant; a few seconds is plenty (zombies also count as
            # alive here, hence the bound).
            kill_deadline = time.monotonic() + 5
            while self._group_alive() and time.monotonic() < kill_deadline:
                time.sleep(0.05)
        return code

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
