"""A client that leaves a streamed answer as soon as its headers arrive: a raw socket
reads the status line and headers byte by byte (nothing of the body), then closes."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx


def leave_after_headers(
    base_url: str, path: str, api_key: str, body: dict[str, Any], timeout: float = 60
) -> bytes:
    """POST ``body`` to ``base_url + path``, read the answer's head, hang up; returns the
    head (status line and headers)."""
    url = httpx.URL(base_url)
    payload = json.dumps(body).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
        f"Authorization: Bearer {api_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    head = b""
    with socket.create_connection((url.host, url.port or 80), timeout=timeout) as sock:
        sock.sendall(request)
        while not head.endswith(b"\r\n\r\n"):
            byte = sock.recv(1)
            if not byte:
                break
            head += byte
    return head
