"""Session-wide real backing services: a redis-server process and a moto S3 server.

Both run for the whole session on free loopback ports and are shared by every test
directory. Tests isolate themselves with their own Redis key namespace and bucket rather
than restarting the servers.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from preft_serve.common.local_redis import NOT_INSTALLED, running_redis

from tests.support.ports import free_port, wait_for_port


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """URL of a real redis-server (no persistence), killed at the end of the session."""
    if shutil.which("redis-server") is None:
        pytest.fail(NOT_INSTALLED)
    with running_redis() as url:
        yield url


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
        wait_for_port(port, proc, 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)
