"""A client leaving mid-stream: the gateway closes the worker's stream (vLLM then aborts
the request) and frees the worker's in-flight slot. Real uvicorn, real sockets; the worker
is a MockTransport stream that never ends on its own."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from preft_serve.common.registry_client import RegistryKeys, parse_usage
from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.gateway.usage import utc_day
from tests.support.gateway import AUTH, KEY, MSGS, FakeRegistry
from tests.support.inprocess import serve_in_thread
from tests.support.leaving_client import leave_after_headers


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


class EndlessStream(httpx.AsyncByteStream):
    """A worker's stream that never ends; with ``continuous_usage_stats`` asked, each chunk
    carries the running totals, as vLLM's do."""

    def __init__(self, totals: bool = False) -> None:
        self.sent = 0
        self.totals = totals
        self.closed = threading.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            self.sent += 1
            chunk: dict[str, Any] = {
                "model": "x",
                "choices": [{"delta": {"content": f"t{self.sent} "}}],
            }
            if self.totals:
                chunk["usage"] = {
                    "prompt_tokens": 7,
                    "completion_tokens": self.sent,
                    "total_tokens": 7 + self.sent,
                }
            yield f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()
            await asyncio.sleep(0.02)

    async def aclose(self) -> None:
        self.closed.set()


def test_client_disconnect_closes_the_worker_stream_and_frees_the_slot() -> None:
    streams: list[EndlessStream] = []

    def worker(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"data": []})
        options = json.loads(request.content).get("stream_options") or {}
        streams.append(EndlessStream(totals=bool(options.get("continuous_usage_stats"))))
        return httpx.Response(
            200, stream=streams[-1], headers={"content-type": "text/event-stream"}
        )

    app = create_app(
        GatewaySettings(worker_urls=["http://w1:8000"], base_model_name="tiny"),
        transport=httpx.MockTransport(worker),
        registry=FakeRegistry(),
    )
    server, thread, url = serve_in_thread(app)
    try:
        with httpx.stream(
            "POST",
            f"{url}/v1/chat/completions",
            headers=AUTH,
            timeout=10,
            json={"messages": MSGS, "user": "u1", "stream": True},
        ) as response:
            assert response.status_code == 200
            # Keep the line iterator: an abandoned one is finalised at once, and closing it
            # closes the connection (httpcore), i.e. the client would already have left.
            lines = response.iter_lines()
            first = next(lines)
            assert first.startswith("data: ") and json.loads(first[6:])["model"] == "bot"
            assert "usage" not in json.loads(first[6:])  # the client did not ask for it
            pool = app.state.gateway.pool
            assert pool.inflight == {"http://w1:8000": 1}
        # The client is gone: the worker stream must be closed and the slot released.
        assert streams[0].closed.wait(30)
        deadline = time.monotonic() + 30
        while pool.inflight != {"http://w1:8000": 0} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pool.inflight == {"http://w1:8000": 0}
        # What the worker produced for the client that left is counted: its prompt and
        # the tokens up to the last totals the gateway read (at least the one relayed).
        text = httpx.get(f"{url}/metrics", timeout=10).text
        assert metric(text, 'preft_gateway_prompt_tokens_total{adapter="bot"}') == 7
        generated = metric(text, 'preft_gateway_generation_tokens_total{adapter="bot"}')
        assert 1 <= generated <= streams[0].sent
    finally:
        server.should_exit = True
        thread.join(10)


class SilentStream(httpx.AsyncByteStream):
    """A worker's stream whose first chunk never comes (a long prefill, a queue)."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        await asyncio.sleep(3600)
        yield b""

    async def aclose(self) -> None:
        self.closed.set()


@pytest.mark.parametrize(("tokenized", "prompt_tokens"), [(200, 9), (500, 0)])
def test_a_client_leaving_before_the_first_chunk_is_billed_its_prompt(
    redis_server: str, tokenized: int, prompt_tokens: int
) -> None:
    """The worker took the request but sent no chunk yet: the gateway closes its stream,
    asks a worker to count the prompt (with the request's rendering options) and bills the
    request and that count; a worker that cannot count it still leaves the request
    billed."""
    streams: list[SilentStream] = []
    tokenize_bodies: list[dict[str, Any]] = []

    def worker(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"data": []})
        if request.url.path == "/tokenize":
            tokenize_bodies.append(json.loads(request.content))
            return httpx.Response(
                tokenized, json={"count": 9, "max_model_len": 256, "tokens": list(range(9))}
            )
        streams.append(SilentStream())
        return httpx.Response(
            200, stream=streams[-1], headers={"content-type": "text/event-stream"}
        )

    namespace = f"dc{uuid.uuid4().hex[:8]}"
    app = create_app(
        GatewaySettings(
            worker_urls=["http://w1:8000"],
            base_model_name="tiny",
            worker_base_model="/models/tiny",
            namespace=namespace,
        ),
        transport=httpx.MockTransport(worker),
        registry=FakeRegistry(),
        redis_client=aioredis.Redis.from_url(redis_server),
    )
    usage_key = RegistryKeys(namespace).usage("acme", utc_day())
    sync = redis.Redis.from_url(redis_server)
    server, thread, url = serve_in_thread(app)
    try:
        head = leave_after_headers(
            url,
            "/v1/chat/completions",
            KEY,
            {"messages": MSGS, "user": "u1", "stream": True, "chat_template_kwargs": {"x": 1}},
        )
        assert head.startswith(b"HTTP/1.1 200"), head
        assert streams[0].closed.wait(30)
        deadline = time.monotonic() + 30
        while "bot" not in parse_usage(sync.hgetall(usage_key)):
            assert time.monotonic() < deadline, "the request was not billed"
            time.sleep(0.05)
        assert tokenize_bodies == [
            {"messages": MSGS, "chat_template_kwargs": {"x": 1}, "model": "/models/tiny"}
        ]
        assert parse_usage(sync.hgetall(usage_key)) == {
            "bot": {"requests": 1, "prompt_tokens": prompt_tokens, "completion_tokens": 0}
        }
        text = httpx.get(f"{url}/metrics", timeout=10).text
        assert metric(text, 'preft_gateway_prompt_tokens_total{adapter="bot"}') == prompt_tokens
        assert app.state.gateway.pool.inflight == {"http://w1:8000": 0}
    finally:
        server.should_exit = True
        thread.join(10)
        sync.close()
