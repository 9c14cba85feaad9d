"""A private redis-server for local runs, tests and benchmarks (never for production).

:func:`redis_server_argv` is the one command line (loopback only, protected mode, no RDB
snapshots; an append-only file fsynced on every write when ``persistent``), and
:func:`running_redis` starts a throwaway server on a free loopback port and yields its URL.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis

NOT_INSTALLED = "redis-server is not installed (apt-get install redis-server)"


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_server_argv(port: int, data_dir: str | Path, *, persistent: bool = False) -> list[str]:
    """``redis-server`` listening on 127.0.0.1:``port`` with its files in ``data_dir``;
    raises FileNotFoundError when it is not installed."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError(NOT_INSTALLED)
    durability = (
        ["--appendonly", "yes", "--appendfsync", "always"] if persistent else ["--appendonly", "no"]
    )
    return [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--protected-mode",
        "yes",
        "--dir",
        str(data_dir),
        "--save",
        "",
        *durability,
    ]


def ping(url: str) -> bool:
    """Whether a Redis answers at ``url`` (within a second)."""
    try:
        with redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


@contextlib.contextmanager
def running_redis(timeout: float = 10.0) -> Iterator[str]:
    """A throwaway redis-server (no persistence) on a free loopback port: yields its URL
    once it answers, kills it and removes its directory afterwards."""
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="preft-redis-")
    proc = subprocess.Popen(
        redis_server_argv(port, workdir), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + timeout
        while not ping(url):
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {port} exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {port} did not answer in {timeout} s")
            time.sleep(0.05)
        yield url
    finally:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
