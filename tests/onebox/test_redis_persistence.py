"""`make run`'s Redis keeps its data across a Redis crash (append-only file, as in the
chart), and each run starts empty."""

from __future__ import annotations

import signal
from pathlib import Path

import redis

from preft_serve.onebox.stack import OneBox, StackConfig
from tests.support.ports import free_port


def test_local_stack_redis_survives_sigkill_and_each_run_starts_empty(tmp_path: Path) -> None:
    config = StackConfig(var=tmp_path, redis_port=free_port())
    stack = OneBox(config, say=lambda _: None)
    try:
        child = stack.start_redis()
        client = redis.Redis.from_url(stack.redis_url)
        assert client.config_get("appendonly")["appendonly"] == "yes"
        client.set("preft:tenant:demo", "kept")
        child.proc.send_signal(signal.SIGKILL)  # a crash, not a shutdown
        child.proc.wait(10)
        argv = child.argv
        again = stack.start("redis-again", argv)
        again.wait_ready(lambda: _ping(stack.redis_url), 30, 0.05)
        assert redis.Redis.from_url(stack.redis_url).get("preft:tenant:demo") == b"kept"
        again.stop()
        stack.start_redis()  # a new `make run`
        assert redis.Redis.from_url(stack.redis_url).get("preft:tenant:demo") is None
    finally:
        stack.stop()


def _ping(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.ConnectionError:
        return False
