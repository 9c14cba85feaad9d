"""A valid key whose role may not upload is refused before any of the upload is read.

The upload middleware checks the key before FastAPI reads (and spools to disk) a
multipart body; it must check the key's role for the request's method and path too, or an
``inference`` key's upload, up to ``PREFT_REGISTRY_MAX_UPLOAD_BYTES``, is received in
full before the route's 403.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.asgi import answer_of, multipart_scope
from tests.support.registry_api import bearer

CHUNK = 1 << 16
TOTAL = 64 << 20  # a large upload: 64 MiB, far more than the app reads before answering


def _key(client: TestClient, headers: dict[str, str], role: str) -> dict[str, str]:
    resp = client.post("/v1/keys", json={"role": role}, headers=headers)
    assert resp.status_code == 201, resp.text
    return bearer(resp.json()["api_key"])


def _send_upload(
    app: Any, method: str, path: str, headers: dict[str, str]
) -> tuple[int, dict[str, Any], int]:
    """Stream a large multipart body to ``method path`` straight through the ASGI app:
    (status, JSON body, how many body bytes the app pulled from the stream)."""
    pulled = 0

    def chunks() -> Iterator[bytes]:
        nonlocal pulled
        yield b'--b\r\nContent-Disposition: form-data; name="files"; filename="a.bin"\r\n\r\n'
        while pulled < TOTAL:
            yield b"x" * CHUNK
        yield b"\r\n--b--\r\n"

    stream = chunks()

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        chunk = next(stream, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        pulled += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": True}

    status, _, body = asyncio.run(answer_of(app, multipart_scope(method, path, headers), receive))
    return status, json.loads(body), pulled


UPLOADS = [
    ("POST", "/v1/adapters", "upload or change adapters"),
    ("PUT", "/v1/adapters/bot", "upload or change adapters"),
    ("POST", "/v1/files", "upload or delete files"),
]


@pytest.mark.parametrize(("method", "path", "action"), UPLOADS)
def test_an_inference_keys_large_upload_is_refused_unread(
    client: TestClient,
    acme: dict[str, str],
    state_snapshot: Any,
    method: str,
    path: str,
    action: str,
) -> None:
    inference = _key(client, acme, "inference")
    before = state_snapshot()
    status, body, pulled = _send_upload(client.app, method, path, inference)
    assert status == 403
    assert body["error"]["code"] == "insufficient_role"
    assert body["error"]["message"] == (
        f"this key's role 'inference' cannot {action}; use a key with role developer or admin"
    )
    assert pulled == 0
    assert state_snapshot() == before


@pytest.mark.parametrize(("method", "path", "action"), UPLOADS)
def test_a_developer_keys_upload_is_read(
    client: TestClient, acme: dict[str, str], method: str, path: str, action: str
) -> None:
    # The contrast: the same stream from a key whose role may upload is pulled (and the
    # form refused on its content or size), so ``pulled == 0`` above is the role check.
    status, body, pulled = _send_upload(client.app, method, path, _key(client, acme, "developer"))
    assert pulled > 0
    assert status != 403, body
    assert body["error"]["code"] != "insufficient_role"
