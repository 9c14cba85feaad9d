"""One error envelope for every preft-serve HTTP service: OpenAI's.

Every error response has OpenAI's shape, so the official ``openai`` client, LangChain and
the ``preft`` CLI read it without special cases (``e.type``, ``e.code``, ``e.param``)::

    {"error": {"message": "model 'x' does not exist; GET /v1/models lists yours",
               "type": "invalid_request_error", "param": "model", "code": "model_not_found"}}

``type`` follows the HTTP status the way OpenAI's API does (:func:`error_type`, in
``error_envelope``, which the CLI shares); ``code`` is
a stable machine-readable string, OpenAI's where it has one (``model_not_found``,
``invalid_api_key``, ``rate_limit_exceeded``, ``invalid_value``, ...); ``param`` names the
request field at fault when there is one. Validation errors add ``details`` (every field
problem, not only the first); it is left out otherwise.

Domain logic raises a :mod:`preft_serve.common.domain_errors` error, which knows no HTTP;
:data:`HTTP_STATUS` is the one table from its class to the status it answers with.
:func:`install_error_handlers` turns those, FastAPI's request-validation errors, unknown
routes and unexpected exceptions into that envelope.

HTTP edges (middleware, route dependencies, the gateway's proxying) may raise a
:class:`ServiceError` subclass instead: each is also the domain error of the same meaning
(``BadRequest`` is an ``InvalidRequest``), with its status from the same table, and
subclasses Starlette's ``HTTPException`` on purpose: FastAPI re-raises ``HTTPException`` from
inside body parsing instead of turning it into a generic 400, so a size limit enforced while
the body streams (``common/bodylimit.py``) keeps its 413.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from preft_serve.common import domain_errors as domain
from preft_serve.common.access_log import REQUEST_ID_HEADER, request_id_of
from preft_serve.common.error_envelope import error_body
from preft_serve.common.key_roles import InsufficientRole

logger = logging.getLogger(__name__)


class ErrorBody(BaseModel):
    """What went wrong and what to do about it (OpenAI's error object)."""

    message: str = Field(description="What went wrong and what to do about it.")
    type: str = Field(
        description="OpenAI's error type for the status, e.g. "
        "invalid_request_error, authentication_error."
    )
    param: str | None = Field(default=None, description="The request field at fault, if any.")
    code: str | None = Field(
        default=None,
        description="A stable machine-readable code, e.g. model_not_found, invalid_api_key.",
    )
    details: list[dict[str, Any]] | None = Field(
        default=None, description="Validation errors only: every field problem found."
    )


class ErrorResponse(BaseModel):
    """The envelope every error response uses."""

    error: ErrorBody


HTTP_STATUS: Mapping[type[domain.DomainError], int] = {
    domain.InvalidRequest: 400,
    domain.Unauthenticated: 401,
    domain.QuotaExceeded: 403,
    InsufficientRole: 403,  # a valid key whose role does not allow the route
    domain.NotFound: 404,
    domain.Conflict: 409,
    domain.PreconditionFailed: 412,
    domain.TooLarge: 413,
    domain.UnsupportedFormat: 415,
    domain.InvalidContent: 422,
    domain.RateLimited: 429,
    domain.Unavailable: 503,
}
"""The HTTP status each domain error answers with (a subclass takes its nearest base's)."""

_HEADERS: Mapping[type[domain.DomainError], Mapping[str, str]] = {
    domain.Unauthenticated: {"WWW-Authenticate": "Bearer"},  # RFC 6750: name the scheme
}


def http_status_of(error: type[domain.DomainError]) -> int:
    """The status for this domain error class: its nearest listed base's, else 500."""
    for cls in error.__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500


def _headers_of(
    error: type[domain.DomainError], retry_after_s: int | None
) -> dict[str, str] | None:
    """The class's own headers (:data:`_HEADERS`) and ``Retry-After`` when the error says
    when to retry."""
    headers: dict[str, str] = {}
    for cls in error.__mro__:
        if cls in _HEADERS:
            headers.update(_HEADERS[cls])
            break
    if retry_after_s is not None:
        headers["Retry-After"] = str(retry_after_s)
    return headers or None


def domain_error_response(exc: domain.DomainError) -> JSONResponse:
    """A domain error as the envelope response, with its status from :data:`HTTP_STATUS`."""
    if isinstance(exc, ServiceError):
        return exc.response()
    return error_response(
        http_status_of(type(exc)),
        exc.code,
        exc.message,
        param=exc.param,
        details=exc.details,
        headers=_headers_of(type(exc), exc.retry_after_s),
    )


def as_service_error(exc: domain.DomainError) -> ServiceError:
    """``exc`` as the :class:`ServiceError` of the same meaning, for code that must raise
    an ``HTTPException`` (an ASGI ``receive`` that FastAPI's body parsing calls)."""
    if isinstance(exc, ServiceError):
        return exc
    service = next(
        (
            service
            for cls in type(exc).__mro__
            for service in _SERVICE_ERRORS
            if cls in service.__bases__
        ),
        ServiceError,
    )
    return service(
        exc.message,
        code=exc.code,
        param=exc.param,
        details=exc.details,
        retry_after_s=exc.retry_after_s,
    )


class ServiceError(StarletteHTTPException, domain.DomainError):
    """A domain error raised at an HTTP edge, as Starlette's ``HTTPException``.

    Each subclass below is also the domain error of the same meaning, and takes its status
    (``http_status``) from :data:`HTTP_STATUS` and its default ``code`` from that domain
    error; an edge's own error with no domain meaning (a bad gateway, a route this deployment
    does not serve) sets ``http_status`` itself. A raise site may name a more precise
    ``code`` and the ``param`` (request field) at fault.
    """

    http_status: ClassVar[int] = 500

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "http_status" not in cls.__dict__:  # an edge's own status (a 502, a 501) stays
            cls.http_status = http_status_of(cls)

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        details: list[dict[str, Any]] | None = None,
        headers: Mapping[str, str] | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        domain.DomainError.__init__(
            self, message, code=code, param=param, details=details, retry_after_s=retry_after_s
        )
        chosen = dict(headers) if headers else _headers_of(type(self), retry_after_s)
        StarletteHTTPException.__init__(self, self.http_status, message, chosen)

    def __str__(self) -> str:
        return self.message

    def response(self) -> JSONResponse:
        """This error as the envelope response."""
        return error_response(
            self.status_code,
            self.code,
            self.message,
            param=self.param,
            details=self.details,
            headers=self.headers,
        )


class BadRequest(ServiceError, domain.InvalidRequest):
    pass


class Unauthorized(ServiceError, domain.Unauthenticated):
    pass


class NotFound(ServiceError, domain.NotFound):
    pass


class Conflict(ServiceError, domain.Conflict):
    pass


class Forbidden(ServiceError, InsufficientRole):
    """A valid key whose role does not allow the route (``common.key_roles``)."""


class QuotaExceeded(ServiceError, domain.QuotaExceeded):
    """A tenant quota (adapter count, stored bytes) would be exceeded; nothing was stored."""


class PayloadTooLarge(ServiceError, domain.TooLarge):
    pass


class UnsupportedMediaType(ServiceError, domain.UnsupportedFormat):
    pass


class Unprocessable(ServiceError, domain.InvalidContent):
    pass


class TooManyRequests(ServiceError, domain.RateLimited):
    pass


class ServiceUnavailable(ServiceError, domain.Unavailable):
    pass


_SERVICE_ERRORS: tuple[type[ServiceError], ...] = (
    BadRequest,
    Unauthorized,
    NotFound,
    Conflict,
    Forbidden,
    QuotaExceeded,
    PayloadTooLarge,
    UnsupportedMediaType,
    Unprocessable,
    TooManyRequests,
    ServiceUnavailable,
)


def error_response(
    status_code: int,
    code: str | None,
    message: str,
    *,
    param: str | None = None,
    details: list[dict[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """Build the envelope response (also usable from plain ASGI middleware)."""
    return JSONResponse(
        error_body(status_code, message, code=code, param=param, details=details),
        status_code=status_code,
        headers=headers,
    )


def _validation_message(
    errors: list[dict[str, Any]],
) -> tuple[str, str | None, str, list[dict[str, Any]]]:
    """A readable one-line summary, the first field at fault (OpenAI's ``param``), the code
    for the first problem and per-field details of a pydantic/FastAPI error list."""
    details = []
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header")]
        field = ".".join(loc) or "request"
        msg = err.get("msg", "invalid value")
        if err.get("type") == "missing":
            msg = "field required"
        details.append({"field": field, "message": msg})
        parts.append(f"{field}: {msg}")
    first = errors[0] if errors else {}
    code = "missing_required_parameter" if first.get("type") == "missing" else "invalid_value"
    param = details[0]["field"] if details and details[0]["field"] != "request" else None
    return "invalid request: " + "; ".join(parts), param, code, details


async def _domain_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, domain.DomainError)
    return domain_error_response(exc)


# Codes for the errors Starlette raises itself (routing, methods).
_HTTP_CODES: dict[int, str] = {404: "unknown_url", 405: "method_not_allowed"}


async def _http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    headers = exc.headers
    if exc.status_code == 404 and message == "Not Found":
        path = request.url.path
        shown = path if len(path) <= 120 else path[:120] + "..."  # bounded: caller-controlled
        message = f"no such endpoint: {request.method} {shown}; see /docs for the API"
    elif exc.status_code == 405:
        message = "method not allowed on this endpoint; see /docs for the API"
        if allow := _allowed_methods(request):
            headers = {**(exc.headers or {}), "Allow": allow}
    code = _HTTP_CODES.get(
        exc.status_code, "invalid_request" if exc.status_code < 500 else "internal_error"
    )
    return error_response(exc.status_code, code, message, headers=headers)


def _allowed_methods(request: Request) -> str:
    """Every method some route serves on this path (Starlette's 405 names only the first
    matching route's, e.g. ``Allow: PUT`` where GET and DELETE work too)."""
    path = request.scope.get("path", request.url.path)
    methods: set[str] = set()
    for route in request.app.router.routes:
        regex, route_methods = getattr(route, "path_regex", None), getattr(route, "methods", None)
        if regex is not None and route_methods and regex.match(path):
            methods.update(route_methods)
    return ", ".join(sorted(methods))


async def _validation_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, param, code, details = _validation_message(list(exc.errors()))
    return error_response(422, code, message, param=param, details=details)


async def _unexpected_error_handler(request: Request, exc: Exception) -> JSONResponse:
    # Starlette answers this one outside every middleware, so the request id is added here.
    request_id = request_id_of(request)
    logger.error(
        "unhandled error on %s %s",
        request.method,
        request.url.path,
        exc_info=exc,
        extra={"request_id": request_id},
    )
    return error_response(
        500,
        "internal_error",
        "internal server error; the server log has details",
        headers={REQUEST_ID_HEADER: request_id} if request_id else None,
    )


def install_error_handlers(app: FastAPI) -> None:
    """Route every error an app can produce through the one envelope (and document so)."""
    app.add_exception_handler(ServiceError, _domain_error_handler)  # before HTTPException's
    app.add_exception_handler(domain.DomainError, _domain_error_handler)
    app.add_exception_handler(StarletteHTTPException, _http_error_handler)
    app.add_exception_handler(RequestValidationError, _validation_error_handler)
    app.add_exception_handler(Exception, _unexpected_error_handler)
    _document_validation_errors(app)


def _document_validation_errors(app: FastAPI) -> None:
    """FastAPI documents a 422 of its own shape (``HTTPValidationError``, ``{"detail":
    [...]}``) on every route with parameters; this app answers 422 in the envelope."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = build()
        envelope = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
        replaced = False
        for operations in spec.get("paths", {}).values():
            for operation in operations.values():
                response = operation.get("responses", {}).get("422", {})
                if "HTTPValidationError" in str(response.get("content")):
                    response["content"], replaced = envelope, True
        schemas = spec.get("components", {}).get("schemas", {})
        if replaced:
            schemas.pop("HTTPValidationError", None)
            schemas.pop("ValidationError", None)
            for name, model in (("ErrorBody", ErrorBody), ("ErrorResponse", ErrorResponse)):
                schemas.setdefault(
                    name, model.model_json_schema(ref_template="#/components/schemas/{model}")
                )
        return spec

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override


def error_responses(*status_codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries documenting the envelope for these status codes."""
    return {
        code: {"model": ErrorResponse, "description": HTTPStatus(code).phrase}
        for code in status_codes
    }
