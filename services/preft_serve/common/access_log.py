"""Request ids and one structured access-log line per request (gateway and registry).

:class:`AccessLogMiddleware` gives every HTTP request an id: the client's ``X-Request-Id``
when it is a sane one (printable ASCII, no surrounding spaces, at most 128 characters),
else a fresh ``uuid4().hex``. The id is returned in ``x-request-id`` on every response
(errors and streams too; the openai client shows it as ``response._request_id`` /
``error.request_id``), and handlers read it with :func:`request_id_of` (the gateway
forwards it to the worker). When the response is done the middleware logs one line on
``logger_name``: method, route template, status, latency and the request id, plus whatever
handlers put into :func:`access_fields` (tenant, adapter, user, token counts ...). With
``--log-json`` each of those is a JSON field. Handlers must never put API keys or prompt
text there; the redacting filter is a backstop, not the plan.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID_CHARS = 128
# Printable ASCII (space included), not starting or ending with a space.
_REQUEST_ID = re.compile(rf"[\x21-\x7e](?:[\x20-\x7e]{{0,{MAX_REQUEST_ID_CHARS - 2}}}[\x21-\x7e])?")
_ID_KEY = "request_id"
_FIELDS_KEY = "access_log"


def valid_request_id(value: str) -> bool:
    return _REQUEST_ID.fullmatch(value) is not None


def request_id_from(value: str | None) -> str:
    """The client's id if it is acceptable, else a new one."""
    return value if value is not None and valid_request_id(value) else uuid.uuid4().hex


def request_id_of(request: Request) -> str | None:
    """The id :class:`AccessLogMiddleware` gave this request (None: no middleware)."""
    value = request.scope.get("state", {}).get(_ID_KEY)
    return value if isinstance(value, str) else None


def access_fields(request: Request) -> dict[str, Any]:
    """The request's access-log fields, for handlers to add to (a throwaway dict when the
    app runs without :class:`AccessLogMiddleware`)."""
    fields = request.scope.get("state", {}).get(_FIELDS_KEY)
    return fields if isinstance(fields, dict) else {}


class AccessLogMiddleware:
    """Assigns the request id, returns it, logs the access line (outermost middleware)."""

    def __init__(self, app: ASGIApp, logger_name: str) -> None:
        self.app = app
        self.logger = logging.getLogger(logger_name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        incoming = None
        for name, value in scope.get("headers", ()):
            if name == REQUEST_ID_HEADER.encode():
                incoming = value.decode("latin-1")
                break
        request_id = request_id_from(incoming)
        fields: dict[str, Any] = {}
        # scope["state"] is the dict Request.state reads, also from the outer error
        # handler (an unexpected 500 gets the header there: see common.errors).
        state = scope.setdefault("state", {})
        state[_ID_KEY], state[_FIELDS_KEY] = request_id, fields
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except BaseException:
            status = status or 500
            raise
        finally:
            self._log(scope, request_id, status, start, fields)

    def _log(
        self, scope: Scope, request_id: str, status: int, start: float, fields: dict[str, Any]
    ) -> None:
        if not self.logger.isEnabledFor(logging.INFO):
            return
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        latency_ms = round((time.perf_counter() - start) * 1000, 1)
        method = scope["method"]
        # status 0: the client went away before any response was started. The record is
        # made here rather than by ``logger.info``, which would walk the stack for the
        # caller's file and line (no format shows them; ~5 us of a ~25 us line).
        record = self.logger.makeRecord(
            self.logger.name,
            logging.INFO,
            __file__,
            0,
            "%s %s %d %.1fms",
            (method, route, status, latency_ms),
            None,
            "_log",
            extra={
                "request_id": request_id,
                "method": method,
                "route": route,
                "status": status,
                "latency_ms": latency_ms,
                **fields,
            },
        )
        self.logger.handle(record)
