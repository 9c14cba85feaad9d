"""Real service processes for end-to-end tests: start, wait until ready, stop or kill.

Each process gets its own process group (so a kill takes any children with it and a
Ctrl-C in the test runner does not race our own shutdown) and a log file under the test's
directory, whose tail is shown when the process fails to start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.tiers import tier


@dataclass
class ServiceProcess:
    """One started process; ``url`` is its HTTP base URL (empty for non-HTTP services)."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str]
    cwd: Path
    url: str = ""
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> ServiceProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def wait_ready(self, ready: Callable[[], bool], timeout: float) -> None:
        """Poll ``ready()`` until it is true; raise with the log if the process died."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                raise RuntimeError(f"{self.name} exited during start-up:\n{self.log_tail()}")
            if ready():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.2)

    def wait_http(self, path: str, timeout: float) -> None:
        def ok() -> bool:
            try:
                return httpx.get(f"{self.url}{path}", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        self.wait_ready(ok, timeout)

    def kill(self) -> None:
        """SIGKILL the whole process group: a crash, no graceful shutdown."""
        self._signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)

    def stop(self, grace: float = 30) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; idempotent."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        self._signal_group(signal.SIGKILL)  # stragglers in the group, if any
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


def service(
    name: str, argv: Sequence[str], root: Path, env: dict[str, str] | None = None, url: str = ""
) -> ServiceProcess:
    """A not-yet-started process whose log is ``root/<name>.log``."""
    root.mkdir(parents=True, exist_ok=True)
    return ServiceProcess(
        name, list(argv), root / f"{name}.log", {**os.environ, **(env or {})}, root, url
    )


@tier("stack")
@contextlib.contextmanager
def running_http_service(
    name: str,
    argv: Sequence[str],
    root: Path,
    url: str,
    env: dict[str, str] | None = None,
    ready_path: str = "/healthz",
    timeout: float = 60,
) -> Iterator[ServiceProcess]:
    """Start an HTTP service, wait until ``GET ready_path`` is 200, yield it, stop it."""
    process = service(name, argv, root, env, url).start()
    try:
        process.wait_http(ready_path, timeout)
        yield process
    finally:
        process.stop()
