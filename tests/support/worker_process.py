"""A real worker (``python -m preft_serve.worker.serve``) as a subprocess, for e2e tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

SMALL_WORKER_ARGS = ("--kv-cache-gib", "0.0625", "--max-model-len", "256")


@contextlib.contextmanager
def running_worker(model: Path, root: Path, args: list[str], env: dict[str, str] | None = None,
                   timeout: float = 120) -> Iterator[str]:
    """Start a worker on a free port, wait for ``/health``, yield its URL, stop it.

    Its log goes to ``root/worker.log`` and is shown if it fails to start.
    """
    port = free_port()
    log_path = root / "worker.log"
    full_env = {**os.environ, **(env or {}), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "preft_serve.worker.serve", "--model", str(model),
             "--port", str(port), *args, *SMALL_WORKER_ARGS],
            env=full_env, stdout=log, stderr=subprocess.STDOUT, cwd=root,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("worker did not start:\n" + log_path.read_text()[-4000:])
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
