"""What every step of an evaluation run shares: a refusal to relay, and one request into
this gateway's own app whose refusal names the example and the version."""

from __future__ import annotations

from typing import Any

import httpx

CONCURRENCY = 4  # examples in flight at once in each step of a run


class Refused(Exception):
    """A step was refused: the answer to relay (status, envelope, and when to retry if
    the refusal said)."""

    def __init__(self, status: int, payload: Any, retry_after: str | None = None) -> None:
        super().__init__(status)
        self.status, self.payload, self.retry_after = status, payload, retry_after


def error(status: int, message: str, code: str, retry_after: str | None = None) -> Refused:
    return Refused(status, {"error": {"message": message, "type": code, "code": code}}, retry_after)


async def post(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], model: str, line: int
) -> dict[str, Any]:
    """One request into this gateway's app; a refusal names the example and the version."""
    reply = await client.post(path, json=body)
    try:
        payload = reply.json()
    except ValueError:
        payload = None
    if reply.status_code != 200 or not isinstance(payload, dict):
        envelope = payload.get("error") if isinstance(payload, dict) else None
        message = envelope.get("message") if isinstance(envelope, dict) else reply.text[:300]
        raise error(
            reply.status_code if reply.status_code >= 400 else 502,
            f"example {line} on {model}: {message}",
            "evaluation_failed",
            reply.headers.get("retry-after"),  # a busy refusal: when the run may try again
        )
    return payload
