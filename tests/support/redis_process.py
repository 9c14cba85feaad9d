"""A redis-server of a test's own that can crash and come back on the same port and data.

The session's shared Redis (``tests/conftest.py``) must never go away under other tests;
outage tests use this one. Every write is fsynced to an append-only file, so a SIGKILL
loses nothing and a restart on the same directory brings all the data back, like a Redis
with persistence after a crash.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

from preft_serve.common import local_redis
from tests.support.processes import ServiceProcess, service
from tests.support.tiers import tier


@tier("outage")
class RedisProcess:
    """``start`` / ``kill`` / ``start`` again: same port, same data directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = local_redis.free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._argv = local_redis.redis_server_argv(self.port, root, persistent=True)
        self._process: ServiceProcess | None = None

    def start(self, timeout: float = 15) -> RedisProcess:
        self._process = service("redis", self._argv, self.root).start()
        self._process.wait_ready(self.ping, timeout)
        return self

    def ping(self) -> bool:
        return local_redis.ping(self.url)

    def kill(self) -> None:
        """Crash it (SIGKILL): clients see refused connections until ``start``."""
        if self._process is not None:
            self._process.kill()

    def pause(self) -> None:
        """Stall it (SIGSTOP): connections stay open and accepted, nothing is answered."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        if self._process is not None and self._process.running:
            assert self._process.proc is not None
            os.kill(self._process.proc.pid, sig)

    def wipe(self) -> None:
        """Delete the data files (while stopped): the next ``start`` comes back empty."""
        for path in self.root.glob("appendonly*"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        (self.root / "dump.rdb").unlink(missing_ok=True)

    def stop(self) -> None:
        if self._process is not None:
            self.resume()  # a stopped process would not act on SIGTERM
            self._process.stop()
