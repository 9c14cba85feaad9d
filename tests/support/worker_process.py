"""A real worker (``python -m preft_serve.worker.serve``) as a subprocess, for e2e tests."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.processes import ServiceProcess, service
from tests.support.tiers import tier

SMALL_WORKER_ARGS = ("--kv-cache-gib", "0.0625", "--max-model-len", "256")
# A worker is ready in ~15 s on an idle machine, but a CI machine running two test processes
# that each start engines has been seen to spend over 120 s spawning one: wait long enough
# that only a real hang fails.
WORKER_START_TIMEOUT_S = 300.0


@tier("stack")
def start_worker(
    model: Path,
    root: Path,
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: float = WORKER_START_TIMEOUT_S,
    name: str = "worker",
) -> ServiceProcess:
    """Start a worker on a free port and wait for ``/health``; the caller stops (or kills) it.

    It runs in its own process group, logging to ``root/<name>.log``; a failed start
    fails the test with the log's tail. ``args`` come after the small test defaults
    (``SMALL_WORKER_ARGS``), so they can override them (vLLM keeps a flag's last value).
    """
    port = free_port()
    process = service(
        name,
        [
            sys.executable,
            "-m",
            "preft_serve.worker.serve",
            "--model",
            str(model),
            "--port",
            str(port),
            *SMALL_WORKER_ARGS,
            *args,
        ],
        root,
        {**(env or {}), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        url=f"http://127.0.0.1:{port}",
    ).start()
    try:
        process.wait_http("/health", timeout)
    except RuntimeError as exc:
        process.stop()
        pytest.fail(f"worker did not start: {exc}")
    return process


@tier("stack")
@contextlib.contextmanager
def running_worker(
    model: Path,
    root: Path,
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: float = WORKER_START_TIMEOUT_S,
    name: str = "worker",
) -> Iterator[str]:
    """Start a worker on a free port, wait for ``/health``, yield its URL, stop it.

    Its log goes to ``root/<name>.log`` and is shown if it fails to start.
    """
    process = start_worker(model, root, args, env, timeout, name)
    try:
        yield process.url
    finally:
        process.stop()
