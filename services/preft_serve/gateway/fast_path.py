"""The two completion routes served as plain ASGI, ahead of FastAPI's router.

Every completion is a POST to one of two fixed paths, and FastAPI's layers around its
handler — exception middleware, exit stack, route matching, ``request_response``,
dependency solving — were ~28% of the gateway's in-process CPU per completion (behind a
real server, skipping them is 0.94x CPU per request: docs/benchmarks.md). This middleware
serves exactly ``POST /v1/chat/completions`` and ``POST /v1/completions`` with the same
handler (``routers.completions.serve``) and the same error envelope; everything else
(other methods and paths, ``/docs``) goes to FastAPI as before. The FastAPI routes
stay: they are the OpenAPI document's definitions, and run the same handler when this
middleware is not installed.

It sits inside the access-log and body-limit middlewares (request id, 413s) and inside
Starlette's outermost error middleware, so an unexpected exception still becomes the 500
envelope there.
"""

from __future__ import annotations

import logging

import redis
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from preft_serve.common.errors import ServiceError, ServiceUnavailable, error_response
from preft_serve.gateway.metrics import GatewayMetrics
from preft_serve.gateway.routers import completions

logger = logging.getLogger(__name__)


def redis_unavailable(exc: Exception, metrics: GatewayMetrics) -> JSONResponse:
    """The 503 for a Redis outage (the app's handler for ``redis.RedisError`` too), counted
    like every other failure."""
    logger.error("Redis unavailable: %s", exc)
    metrics.errors.labels(ServiceUnavailable.code).inc()
    return error_response(
        503, ServiceUnavailable.code, "the registry's Redis is unavailable; retry shortly"
    )


ROUTES = {"/v1/chat/completions": True, "/v1/completions": False}  # path -> chat


class CompletionFastPath:
    """Pure ASGI middleware: the completion POSTs bypass FastAPI's routing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._routes: dict[str, object] = {}  # path -> FastAPI route (access log, tracing)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chat = ROUTES.get(scope.get("path", "")) if scope["type"] == "http" else None
        if chat is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        scope["route"] = self._route(scope, path)
        request = Request(scope, receive)
        try:
            response = await completions.serve(request, path, chat)
        except ServiceError as exc:
            response = exc.response()
        except redis.RedisError as exc:
            response = redis_unavailable(exc, scope["app"].state.metrics)
        await response(scope, receive, send)

    def _route(self, scope: Scope, path: str) -> object:
        """The FastAPI route of ``path`` (its ``path`` names the route in the access log)."""
        route = self._routes.get(path)
        if route is None:
            for candidate in scope["app"].router.routes:
                if getattr(candidate, "path", None) == path:
                    route = self._routes[path] = candidate
                    break
        return route
