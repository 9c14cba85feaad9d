"""Uploads are authenticated before their body is read.

FastAPI reads a multipart form (spooling its files to disk) before it resolves a route's
dependencies, so an upload without a valid tenant key was received in full, up to
``PREFT_REGISTRY_MAX_UPLOAD_BYTES``, before its 401: anyone could fill the registry's
temporary disk. Every multipart body here is a tenant's upload (adapters, fine-tuning
files), so this middleware checks the tenant key of each one first, with the same check
and the same 401 as the routes' ``require_tenant`` (which runs again after it).
"""

from __future__ import annotations

import logging

import anyio
import redis
from fastapi.security.utils import get_authorization_scheme_param
from preft_serve.common.errors import ServiceError, Unauthorized, error_response
from preft_serve.registry.limits import is_upload
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

logger = logging.getLogger(__name__)


class UploadAuthMiddleware:
    """401 (503 when Redis is down) for an upload whose tenant key does not check out,
    before any of its body is read."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_upload(scope):
            refusal = await _refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _refusal(scope: Scope) -> Response | None:
    header = next((value.decode("latin-1") for name, value in scope.get("headers", ())
                   if name == b"authorization"), None)
    scheme, token = get_authorization_scheme_param(header)
    if scheme.lower() != "bearer" or not token:
        return Unauthorized("missing credentials: send 'Authorization: Bearer <API key>'"
                            ).response()
    tenants = scope["app"].state.registry.tenants
    try:
        await anyio.to_thread.run_sync(tenants.authenticate, token)
    except ServiceError as exc:
        return exc.response()
    except redis.RedisError as exc:  # as the app's handler answers it
        logger.error("Redis unavailable: %s", exc)
        return error_response(503, "service_unavailable", "Redis is unavailable; retry shortly")
    return None
