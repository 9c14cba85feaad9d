"""The gateway drops idle worker connections before the worker does (found by the soak:
with both sides at 5 s, a request sent on a connection the worker was just closing got a
502 "ReadError" from a healthy worker)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from preft_serve.gateway.state import WORKER_KEEPALIVE_S


def vllm_keepalive_default() -> int:
    """vLLM's ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` default, read from its source (importing
    vLLM takes tens of seconds)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    text = (Path(spec.origin).parent / "envs.py").read_text()
    match = re.search(r"VLLM_HTTP_TIMEOUT_KEEP_ALIVE: int = (\d+)", text)
    assert match, "vllm/envs.py no longer declares VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
    return int(match.group(1))


def test_idle_connections_expire_before_the_workers_keepalive() -> None:
    assert vllm_keepalive_default() / 2 >= WORKER_KEEPALIVE_S
