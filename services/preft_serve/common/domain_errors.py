"""What the services' own logic raises when a request cannot be carried out: no HTTP here.

Domain modules (the registry's adapters, tenants, usage and fine-tuning) say *what* went
wrong: the request is invalid, a thing is missing, a state conflicts, a quota is spent. Which
HTTP status and envelope that becomes is the edge's business: the one table from error class
to status is ``preft_serve.common.errors.HTTP_STATUS``, and ``install_error_handlers``
answers these errors with it. So this module imports no web framework, and the same logic
runs unchanged in a route, a background thread or a test.

Each error carries the message (what to fix), a stable ``code`` (OpenAI's where it has one;
each class has a default a raise site may refine), the ``param`` (request field) at fault
and, for a refusal that is over when the caller waits, how many seconds to wait
(``retry_after_s``).
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """Base of the expected errors; the message must tell the caller what to fix."""

    code: str = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        details: list[dict[str, Any]] | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.param = param
        self.details = details
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return self.message


class InvalidRequest(DomainError):
    """The request, as sent, cannot be carried out (a malformed or out-of-range value)."""

    code = "invalid_value"


class Unauthenticated(DomainError):
    """No credentials, or credentials that identify no one."""

    code = "invalid_api_key"


class QuotaExceeded(DomainError):
    """A tenant quota (adapter count, stored bytes) would be exceeded; nothing was stored."""

    code = "quota_exceeded"


class NotFound(DomainError):
    """The named thing does not exist (or the caller may not see it)."""

    code = "not_found"


class Conflict(DomainError):
    """The request contradicts the current state (a name taken, a job already finished)."""

    code = "conflict"


class PreconditionFailed(DomainError):
    """The caller made the change conditional on a state (``If-Match``) that is no longer
    the current one; nothing was changed."""

    code = "precondition_failed"


class TooLarge(DomainError):
    """The content is larger than a configured bound allows."""

    code = "request_too_large"


class UnsupportedFormat(DomainError):
    """The content is in a format this service does not read."""

    code = "unsupported_media_type"


class InvalidContent(DomainError):
    """Well-formed request, unusable content (an adapter whose files do not check out)."""

    code = "invalid_value"


class RateLimited(DomainError):
    """Too many requests of this kind right now; the same request may succeed later."""

    code = "rate_limit_exceeded"


class Unavailable(DomainError):
    """A dependency is down or the service is not ready; retrying later may succeed."""

    code = "service_unavailable"
