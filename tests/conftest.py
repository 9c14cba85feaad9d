"""Session-wide real backing services: a redis-server process and a moto S3 server.

Both run for the whole session on free loopback ports and are shared by every test
directory. Tests isolate themselves with their own Redis key namespace and bucket rather
than restarting the servers.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
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


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """URL of a real redis-server (no persistence), killed at the end of the session."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="preft-redis-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir, "--protected-mode", "yes"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    try:
        _wait_for_port(port, proc, 10)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """Endpoint URL of a real S3-protocol HTTP server (moto), killed at session end.

    A separate process, like a real S3 endpoint: moto's server imports Flask, whose context
    proxies break vLLM's start-up scan of loaded modules if they share the test process.
    """
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    try:
        _wait_for_port(port, proc, 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)
