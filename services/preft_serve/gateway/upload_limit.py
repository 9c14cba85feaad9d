"""The gateway's body limits: the forwarded uploads under the upload limit, every other
body under the (much smaller) body limit, both enforced before a body is read.

Uploads (``common.upload_routes.is_upload_route``: a fine-tuning file, an adapter or its
next version) are streamed to the registry, never buffered, so they may be as large as the
registry accepts; any other body is read whole, so it gets the body limit. A body over its limit is
refused here, before the registry sees a byte of it.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from preft_serve.common.bodylimit import BodySizeLimitMiddleware
from preft_serve.common.upload_routes import is_upload_route


class UploadAwareBodyLimit:
    """:class:`BodySizeLimitMiddleware` with ``upload_bytes`` for uploads (``file_message``
    for files, ``adapter_message`` for adapters) and ``max_bytes`` for the rest."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        message: str,
        upload_bytes: int,
        file_message: str,
        adapter_message: str,
    ) -> None:
        self.bodies = BodySizeLimitMiddleware(app, max_bytes=max_bytes, message=message)
        self.files = BodySizeLimitMiddleware(app, max_bytes=upload_bytes, message=file_message)
        self.adapters = BodySizeLimitMiddleware(
            app, max_bytes=upload_bytes, message=adapter_message
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_upload_route(scope["method"], scope.get("path", "")):
            limit = self.files if scope["path"] == "/v1/files" else self.adapters
            await limit(scope, receive, send)
            return
        await self.bodies(scope, receive, send)
