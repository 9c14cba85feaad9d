"""RelayResponse: streams to the end, stops when the client leaves, surfaces relay errors.

Driven as a plain ASGI app with a scripted ``receive`` (the end-to-end case, a real client
leaving a real uvicorn, is tests/gateway/test_disconnect.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.background import BackgroundTask

from preft_serve.gateway.relay_response import RelayResponse

SCOPE = {
    "type": "http",
    "asgi": {"version": "3.0", "spec_version": "2.3"},
    "method": "POST",
    "path": "/",
    "headers": [],
}


class Stream:
    """Yields ``chunks`` (then waits forever when ``endless``); records its own end."""

    def __init__(self, chunks: int, endless: bool = False, fail: bool = False) -> None:
        self.chunks, self.endless, self.fail = chunks, endless, fail
        self.finished = False
        self.background_runs = 0

    async def __call__(self) -> AsyncIterator[bytes]:
        try:
            for i in range(self.chunks):
                yield f"data: {i}\n\n".encode()
                await asyncio.sleep(0)
            if self.fail:
                raise ValueError("worker stream broke")
            if self.endless:
                await asyncio.Event().wait()
        finally:
            self.finished = True

    async def background(self) -> None:
        self.background_runs += 1


async def _serve(stream: Stream, leave_after: int | None) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    left = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if leave_after is not None and len(sent) > leave_after:
            left.set()

    response = RelayResponse(
        stream(), media_type="text/event-stream", background=BackgroundTask(stream.background)
    )
    await asyncio.wait_for(response(SCOPE, receive, send), 10)
    return sent


def test_streams_every_chunk_then_ends_and_runs_the_background_task() -> None:
    stream = Stream(3)
    sent = asyncio.run(_serve(stream, leave_after=None))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert [m["body"] for m in sent[1:]] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert sent[-1]["more_body"] is False
    assert stream.finished and stream.background_runs == 1


def test_a_client_that_leaves_stops_the_relay_and_the_background_task_still_runs() -> None:
    stream = Stream(2, endless=True)
    sent = asyncio.run(_serve(stream, leave_after=2))  # start + one chunk, then gone
    # The endless stream was cancelled (its cleanup ran) instead of hanging forever.
    assert stream.finished and stream.background_runs == 1
    assert all(m.get("more_body", True) for m in sent)  # no clean end was written


def test_an_error_in_the_relay_propagates() -> None:
    stream = Stream(1, fail=True)
    with pytest.raises(ValueError, match="worker stream broke"):
        asyncio.run(_serve(stream, leave_after=None))
    # The background task (releasing the worker: idempotent) runs on errors too.
    assert stream.finished and stream.background_runs == 1


def test_a_send_that_fails_before_the_body_still_runs_the_background_task() -> None:
    """The body iterator never started, so its own cleanup cannot release the worker:
    the background task must."""
    stream = Stream(2)

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    async def send(message: dict[str, Any]) -> None:
        raise OSError("client connection reset")

    response = RelayResponse(
        stream(), media_type="text/event-stream", background=BackgroundTask(stream.background)
    )
    with pytest.raises(OSError, match="connection reset"):
        asyncio.run(asyncio.wait_for(response(SCOPE, receive, send), 10))
    assert stream.background_runs == 1
