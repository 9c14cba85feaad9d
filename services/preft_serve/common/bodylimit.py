"""A streaming cap on request bodies, enforced before the app reads one.

Checked twice: a declared ``Content-Length`` over the limit is refused before reading, and
the bytes actually received are counted chunk by chunk (chunked uploads declare nothing),
so no request can make the server buffer more than the limit. The registry and the gateway
both use it, each with its own message (what to do about it differs). A path may have its
own limit (the gateway streams file uploads to the registry under the registry's limit).
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from preft_serve.common.errors import PayloadTooLarge, error_response

DRAIN_BYTES = 16 << 20
"""How much of a refused body is read (and dropped) before the 413 is sent. A server that
answers and closes while the client is still sending leaves unread bytes in its socket, and
the kernel then resets the connection, which can discard the 413 before the client reads it
(the client sees a reset, or a proxy in front a broken upload, instead of the reason).
Reading what is left first makes the answer arrive; beyond this many bytes the connection is
closed anyway (the client may see a reset)."""


async def drain(receive: Receive, budget: int = DRAIN_BYTES) -> None:
    """Read and drop the rest of a request body, at most ``budget`` bytes."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


class BodySizeLimitMiddleware:
    """Pure ASGI middleware (no buffering) that caps every request body at ``max_bytes``;
    a larger one gets a 413 with ``message``. ``paths`` maps an exact path to its own
    ``(max_bytes, message)``."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        message: str,
        paths: Mapping[str, tuple[int, str]] | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.message = message
        self.paths = dict(paths or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes, refusal = self.paths.get(scope.get("path", ""), (self.max_bytes, self.message))
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > max_bytes:
                if int(value) <= DRAIN_BYTES:
                    await drain(receive)
                exc = PayloadTooLarge(refusal)
                response = error_response(
                    exc.status_code, exc.code, exc.message, headers={"Connection": "close"}
                )
                await response(scope, receive, send)
                return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    if message.get("more_body", False):
                        await drain(receive)
                    # An HTTPException subclass: FastAPI re-raises it from body parsing and
                    # the error handler renders the 413 envelope.
                    raise PayloadTooLarge(refusal)
            return message

        await self.app(scope, limited_receive, send)
