"""JSON request bodies, bounded before the app reads them.

Every body is capped by ``preft_serve.common.bodylimit``; every body but the multipart
uploads is a small JSON document, so those are capped far lower here and their nesting
depth is measured before FastAPI parses them.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from preft_serve.common.errors import BadRequest, PayloadTooLarge, ServiceError, error_response
from preft_serve.common.jsondepth import json_depth
from preft_serve.common.upload_routes import is_upload_route

MAX_JSON_BODY_BYTES = 1 << 20  # tenant, rate-limit and binding bodies: a few small fields
MAX_JSON_DEPTH = 32


def is_upload(scope: Scope) -> bool:
    """Whether the body is a multipart form sent to an upload route (``common.upload_routes``:
    bounded by the upload size cap instead). Every other body gets the JSON bounds, whatever
    its content type claims: matching FastAPI's own idea of "JSON" byte for byte is fragile
    (it strips characters like NBSP that ``bytes.strip`` keeps, so ``application/json\xa0``
    once slipped past a JSON check here), and no other kind of body is large (a multipart
    body sent to a JSON route was read whole before its 422)."""
    if not is_upload_route(scope.get("method", ""), scope.get("path", "")):
        return False
    for name, value in scope.get("headers", []):
        if name == b"content-type":
            return bool(value.split(b";", 1)[0].strip().lower() == b"multipart/form-data")
    return False


class JsonBodyGuardMiddleware:
    """Bounds JSON request bodies before FastAPI parses them: at most ``max_bytes`` (413)
    and ``max_depth`` levels of arrays/objects (400; json.loads recurses per level, so a
    nesting bomb was a RecursionError). Multipart uploads pass through untouched."""

    def __init__(
        self, app: ASGIApp, max_bytes: int = MAX_JSON_BODY_BYTES, max_depth: int = MAX_JSON_DEPTH
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_upload(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # disconnected: let the app see it
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._refuse(
                    scope,
                    receive,
                    send,
                    PayloadTooLarge(
                        f"request body is larger than {self.max_bytes} bytes; the registry's "
                        "JSON bodies are a few small fields (adapters are uploaded as "
                        "multipart/form-data)"
                    ),
                )
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        depth = json_depth(body)
        if depth > self.max_depth:
            await self._refuse(
                scope,
                receive,
                send,
                BadRequest(
                    f"request body nests JSON arrays/objects {depth} levels deep; the limit is "
                    f"{self.max_depth}"
                ),
            )
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, exc: ServiceError) -> None:
        response = error_response(
            exc.status_code, exc.code, exc.message, headers={"Connection": "close"}
        )
        await response(scope, receive, send)
