"""An upload without a valid tenant key is refused before any of its body is read.

FastAPI reads (and spools to disk) a whole multipart form before the route's
authentication runs, so anyone could send ``PREFT_REGISTRY_MAX_UPLOAD_BYTES`` per request
to the registry's temporary disk and only then get the 401 (found in a review)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest


def _call(app: Any, headers: dict[str, str]) -> tuple[int, dict[str, Any], int]:
    """POST a (never-ending) multipart body to /v1/adapters straight through the ASGI app:
    (status, JSON body, how many times the app asked for body bytes)."""
    asked = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal asked
        asked += 1
        if asked > 4:  # enough to see that it reads: end the body
            return {"type": "http.request", "body": b"--b--\r\n", "more_body": False}
        return {"type": "http.request", "body": b"x" * 65536, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/adapters",
        "raw_path": b"/v1/adapters",
        "root_path": "",
        "query_string": b"",
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
        "headers": [
            (b"content-type", b"multipart/form-data; boundary=b"),
            *((k.lower().encode(), v.encode()) for k, v in headers.items()),
        ],
    }
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body), asked


@pytest.mark.parametrize(
    ("headers", "needle"),
    [
        ({}, "missing credentials: send 'Authorization: Bearer <API key>'"),
        ({"Authorization": "Basic dXNlcjpwdw=="}, "missing credentials"),
        ({"Authorization": "Bearer pft_0000.not-a-key"}, "invalid or revoked API key"),
        ({"Authorization": "Bearer sk-openai"}, "not a preft API key"),
    ],
)
def test_upload_without_a_valid_key_is_refused_unread(
    client, state_snapshot, headers, needle
) -> None:
    before = state_snapshot()
    status, body, asked = _call(client.app, headers)
    assert status == 401
    assert needle in body["error"]["message"]
    assert asked == 0
    assert state_snapshot() == before


def test_upload_with_a_valid_key_is_read(client, acme) -> None:
    status, body, asked = _call(client.app, acme)
    assert asked > 0  # the form is parsed (and found malformed): auth let it through
    assert status in (400, 422), body


def test_upload_while_redis_is_down_is_503_unread(client, acme, monkeypatch) -> None:
    import redis

    def down(_key: str) -> None:
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(client.app.state.registry.tenants, "authenticate", down)
    status, body, asked = _call(client.app, acme)
    assert (status, asked) == (503, 0)
    assert body["error"]["message"] == "Redis is unavailable; retry shortly"
