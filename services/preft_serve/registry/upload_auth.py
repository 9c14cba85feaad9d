"""Uploads are authenticated before their body is read.

FastAPI reads a multipart form (spooling its files to disk) before it resolves a route's
dependencies, so an upload without a valid tenant key was received in full, up to
``PREFT_REGISTRY_MAX_UPLOAD_BYTES``, before its 401: anyone could fill the registry's
temporary disk. Every multipart body here is a tenant's upload (adapters, fine-tuning
files), so this middleware checks the tenant key of each one first, and the key's role
for the request's method and path (a valid key whose role may not upload, such as an
``inference`` key, gets its 403 before the body too), with the routes' own check
(``deps.tenant_of_header``; ``require_tenant`` runs again after it).
"""

from __future__ import annotations

import anyio
import redis
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from preft_serve.common.domain_errors import DomainError
from preft_serve.common.errors import domain_error_response
from preft_serve.registry.deps import tenant_of_header
from preft_serve.registry.json_body_guard import is_upload


class UploadAuthMiddleware:
    """401 (403 for a role that may not, 503 when Redis is down) for an upload whose
    tenant key does not check out, before any of its body is read."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_upload(scope):
            refusal = await _refusal(Request(scope))
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _refusal(request: Request) -> Response | None:
    app = request.app
    try:
        await anyio.to_thread.run_sync(
            tenant_of_header,
            app.state.registry,
            request.headers.get("authorization"),
            request.method,
            request.url.path,
        )
    except DomainError as exc:
        return domain_error_response(exc)
    except redis.RedisError as exc:  # middleware is outside the app's handlers: call its own
        response: Response = await app.exception_handlers[redis.RedisError](request, exc)
        return response
    return None
