"""A refused body is read before its 413 is sent (``common.bodylimit``): a server that
answers and closes with the client's bytes unread gets its connection reset by the kernel,
which can lose the 413 (seen through the gateway's upload forwarding as a 503). Bodies
beyond the drain budget are refused without reading."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from preft_serve.common import bodylimit
from preft_serve.common.bodylimit import BodySizeLimitMiddleware
from preft_serve.common.errors import PayloadTooLarge

Event = tuple[str, Any]


async def app(scope: Any, receive: Any, send: Any) -> None:
    while (await receive()).get("more_body"):  # the app reads its whole body
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def run(chunks: list[bytes], content_length: int | None, limit: int = 10) -> list[Event]:
    """What happened, in order: ("read", bytes) for each chunk the server took, then
    ("status", code) when the answer started."""
    events: list[Event] = []
    pending = list(chunks)

    async def receive() -> dict[str, Any]:
        body = pending.pop(0)
        events.append(("read", body))
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            events.append(("status", message["status"]))

    headers = [] if content_length is None else [(b"content-length", str(content_length).encode())]
    scope = {"type": "http", "path": "/up", "method": "POST", "headers": headers}
    middleware = BodySizeLimitMiddleware(app, limit, "too large")
    try:
        asyncio.run(middleware(scope, receive, send))  # type: ignore[arg-type]
    except PayloadTooLarge:  # the streamed case: FastAPI's handler answers
        events.append(("status", 413))
    return events


def test_a_declared_oversize_body_is_read_before_the_413() -> None:
    chunks = [b"x" * 8, b"x" * 8, b"x" * 8]
    assert run(chunks, content_length=24) == [*(("read", c) for c in chunks), ("status", 413)]


def test_a_streamed_oversize_body_is_read_to_its_end_before_the_413() -> None:
    chunks = [b"x" * 8, b"x" * 8, b"x" * 8, b"x"]
    assert run(chunks, content_length=None) == [*(("read", c) for c in chunks), ("status", 413)]


def test_a_body_beyond_the_drain_budget_is_refused_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bodylimit, "DRAIN_BYTES", 16)
    assert run([b"x" * 8] * 3, content_length=24) == [("status", 413)]


def test_a_body_within_the_limit_reaches_the_app() -> None:
    assert run([b"x" * 4, b"x" * 4], content_length=8) == [
        ("read", b"x" * 4),
        ("read", b"x" * 4),
        ("status", 200),
    ]
