"""Loopback ports for the servers tests start."""

from __future__ import annotations

import socket
import subprocess
import time

from preft_serve.common.local_redis import free_port

__all__ = ["free_port", "wait_for_port"]


def wait_for_port(port: int, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """Return once something accepts connections on ``port``; raise if ``proc`` exits or
    ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on port {port} after {timeout}s")
