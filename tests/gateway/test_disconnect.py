"""A client leaving mid-stream: the gateway closes the worker's stream (vLLM then aborts
the request) and frees the worker's in-flight slot. Real uvicorn, real sockets; the worker
is a MockTransport stream that never ends on its own."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator

import httpx

from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, MSGS, FakeRegistry
from tests.support.inprocess import serve_in_thread


class EndlessStream(httpx.AsyncByteStream):
    def __init__(self) -> None:
        self.sent = 0
        self.closed = threading.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            self.sent += 1
            chunk = {"model": "x", "choices": [{"delta": {"content": f"t{self.sent} "}}]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
            await asyncio.sleep(0.02)

    async def aclose(self) -> None:
        self.closed.set()


def test_client_disconnect_closes_the_worker_stream_and_frees_the_slot() -> None:
    streams: list[EndlessStream] = []

    def worker(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"data": []})
        streams.append(EndlessStream())
        return httpx.Response(200, stream=streams[-1],
                              headers={"content-type": "text/event-stream"})

    app = create_app(GatewaySettings(worker_urls=["http://w1:8000"], base_model_name="tiny"),
                     transport=httpx.MockTransport(worker),
                     registry=FakeRegistry())
    server, thread, url = serve_in_thread(app)
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", headers=AUTH, timeout=10,
                          json={"messages": MSGS, "user": "u1", "stream": True}) as response:
            assert response.status_code == 200
            # Keep the line iterator: an abandoned one is finalised at once, and closing it
            # closes the connection (httpcore), i.e. the client would already have left.
            lines = response.iter_lines()
            first = next(lines)
            assert first.startswith("data: ") and json.loads(first[6:])["model"] == "bot"
            pool = app.state.gateway.pool
            assert pool.inflight == {"http://w1:8000": 1}
        # The client is gone: the worker stream must be closed and the slot released.
        assert streams[0].closed.wait(30)
        deadline = time.monotonic() + 30
        while pool.inflight != {"http://w1:8000": 0} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pool.inflight == {"http://w1:8000": 0}
    finally:
        server.should_exit = True
        thread.join(10)
