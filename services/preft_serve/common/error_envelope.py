"""The error envelope's shape, OpenAI's, with no web framework attached.

The services build their error responses from it (``preft_serve.common.errors``) and the
``preft`` CLI its own errors, so both speak one shape without the CLI importing FastAPI::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "model",
               "code": "model_not_found"}}
"""

from __future__ import annotations

from typing import Any

# OpenAI's error ``type`` per HTTP status; other 4xx are request errors, 5xx server errors.
_TYPE_BY_STATUS: dict[int, str] = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
}


def error_type(status_code: int) -> str:
    """OpenAI's ``type`` string for an HTTP status."""
    if status_code in _TYPE_BY_STATUS:
        return _TYPE_BY_STATUS[status_code]
    return "server_error" if status_code >= 500 else "invalid_request_error"


def error_body(
    status_code: int,
    message: str,
    *,
    code: str | None,
    param: str | None = None,
    details: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The envelope as a dict: the four OpenAI fields always, ``details`` when given."""
    error: dict[str, Any] = {
        "message": message,
        "type": error_type(status_code),
        "param": param,
        "code": code,
    }
    if details is not None:
        error["details"] = details
    return {"error": error}
