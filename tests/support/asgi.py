"""Calls straight into an ASGI app, for tests that control when a body arrives or an answer
is read (a stalled upload, a client that has not read its download yet)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def multipart_scope(
    method: str,
    path: str,
    headers: dict[str, str],
    content_type: bytes = b"multipart/form-data; boundary=b",
) -> dict[str, Any]:
    """An HTTP scope for ``method path`` with a multipart content type (boundary ``b``
    unless ``content_type`` says otherwise) and ``headers``."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
        "headers": [
            (b"content-type", content_type),
            *((k.lower().encode(), v.encode()) for k, v in headers.items()),
        ],
    }


async def answer_of(
    app: Any, scope: dict[str, Any], receive: Receive, before_send: Send | None = None
) -> tuple[int, dict[str, str], bytes]:
    """Run ``app`` on ``scope``: (status, headers, body) of its answer; ``before_send`` is
    awaited with each message before it is taken (to hold the client's reading)."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        if before_send is not None:
            await before_send(message)
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], headers, body


def stalls_after(body: bytes) -> Receive:
    """A ``receive`` that hands over ``body`` (more to come), then nothing, ever: a
    client that stopped sending."""
    calls = 0

    async def receive() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            return {"type": "http.request", "body": body, "more_body": True}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return receive
