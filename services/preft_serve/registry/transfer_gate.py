"""The gate in front of the calls that move files: uploads and downloads.

Uploads are authenticated before their body is read. FastAPI reads a multipart form
(spooling its files to disk) before it resolves a route's dependencies, so an upload
without a valid tenant key was received in full, up to ``PREFT_REGISTRY_MAX_UPLOAD_BYTES``,
before its 401: anyone could fill the registry's temporary disk. Every multipart body here
is a tenant's upload (adapters, fine-tuning files), so the gate checks the tenant key of
each one first, and the key's role for the request's method and path (a valid key whose
role may not upload, such as an ``inference`` key, gets its 403 before the body too), with
the routes' own check (``deps.tenant_of_header``; ``require_tenant`` runs again after it).

Then every upload and download takes one of the replica's transfer slots
(``transfers.TransferSlots``) for as long as it runs, and counts the scratch disk it holds
(an upload's body as it arrives, which Starlette spools to disk; the staging writers count
their own), and an upload's form is held to
:data:`MAX_UPLOAD_PARTS` parts while it streams in: Starlette keeps each part under 1 MiB
in memory, so a form of many small parts was a body-sized allocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from dataclasses import dataclass

import anyio
import redis
from python_multipart.multipart import parse_options_header
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from preft_serve.common.body_pace import ReaderStalled, paced_receive, paced_send
from preft_serve.common.bodylimit import DRAIN_BYTES, drain
from preft_serve.common.domain_errors import DomainError, RateLimited, Unavailable
from preft_serve.common.errors import BadRequest, as_service_error, domain_error_response
from preft_serve.registry.deps import tenant_of_header
from preft_serve.registry.json_body_guard import is_upload
from preft_serve.registry.transfers import TransferSlots, hold_scratch

logger = logging.getLogger(__name__)

DRAIN_S = 1.0
"""The longest a refused upload's (small) body is read before the answer."""
MAX_UPLOAD_PARTS = 16
"""Form parts one upload may have: an adapter's is its name, mode and two files (or one
archive); a fine-tuning file's, the file and its purpose."""

_DOWNLOADS = re.compile(r"/v1/adapters/[^/]+/download|/v1/files/[^/]+/content")


def is_download_route(method: str, path: str) -> bool:
    """``GET /v1/adapters/{name}/download`` (staged on disk while it is read) and ``GET
    /v1/files/{id}/content`` (held in memory while it is read)."""
    return method == "GET" and _DOWNLOADS.fullmatch(path) is not None


@dataclass(frozen=True)
class TransferPace:
    """How fast a transfer must move to keep its slot (``common.body_pace``)."""

    idle_s: float
    min_rate: float


class TransferGateMiddleware:
    """For an upload or a download: 401/403 (503 when Redis is down) for a tenant key that
    does not check out, before any of an upload's body is read; 429/503 when the tenant or
    the replica has no transfer slot free. A transfer keeps its slot only while it moves:
    an upload's body that stalls or trickles ends in 408, a download read too slowly is
    cut off; and an upload of too many form parts ends in 400."""

    def __init__(self, app: ASGIApp, slots: TransferSlots, pace: TransferPace) -> None:
        self.app = app
        self.slots = slots
        self.pace = pace

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        upload = scope["type"] == "http" and is_upload(scope)
        if not upload and not (
            scope["type"] == "http" and is_download_route(scope["method"], scope["path"])
        ):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        tenant = await _tenant(request)
        if isinstance(tenant, Response):
            await tenant(scope, receive, send)
            return
        try:
            transfer = self.slots.take(tenant)
        except (RateLimited, Unavailable) as exc:
            if upload:
                await _drain_small(scope, receive)
            await _refused(exc, close=upload)(scope, receive, send)
            return
        with transfer:
            try:
                if upload:
                    counted = _parts_counted(_scratch_counted(receive), _boundary(scope))
                    receive = paced_receive(counted, self.pace.idle_s, self.pace.min_rate)
                else:
                    send = paced_send(send, self.pace.idle_s, self.pace.min_rate)
                await self.app(scope, receive, send)
            except ReaderStalled as exc:
                logger.warning("download %s cut off: %s", scope["path"], exc)


async def _drain_small(scope: Scope, receive: Receive) -> None:
    """Read (and drop) a refused upload's body when it is small, for at most a second, so
    its client gets the answer rather than a reset; a larger one is not read at all (its
    client may see the connection close)."""
    for name, value in scope.get("headers", []):
        if name == b"content-length" and (not value.isdigit() or int(value) > DRAIN_BYTES):
            return
    await _drain_briefly(receive)


async def _drain_briefly(receive: Receive) -> None:
    """Read and drop at most ``DRAIN_BYTES`` of a body, for at most :data:`DRAIN_S`."""
    with contextlib.suppress(DomainError, TimeoutError):  # over a size cap, or too slow
        await asyncio.wait_for(drain(receive), DRAIN_S)


def _refused(exc: DomainError, *, close: bool) -> Response:
    """A slot refusal, with when to retry; an upload's connection is closed after it (the
    rest of its body is not read)."""
    response = domain_error_response(exc)
    if close:
        response.headers["Connection"] = "close"
    return response


def _scratch_counted(receive: Receive) -> Receive:
    """``receive`` that counts each chunk of an upload's body against its transfer's
    scratch bytes before passing it on (Starlette spools the form's files to disk), and
    ends the upload in the refusal (429/503 with ``Retry-After``, connection closed) when
    the tenant's or the replica's scratch limit is reached."""

    async def counted() -> Message:
        message = await receive()
        if message["type"] == "http.request":
            try:
                hold_scratch(len(message.get("body", b"")))
            except (RateLimited, Unavailable) as exc:
                if message.get("more_body", False):
                    await _drain_briefly(receive)
                # An HTTPException: FastAPI re-raises it from form parsing (see below).
                refusal = as_service_error(exc)
                refusal.headers = {**(refusal.headers or {}), "Connection": "close"}
                raise refusal from None
        return message

    return counted


async def _tenant(request: Request) -> str | Response:
    """The request's tenant, or the answer that refuses it."""
    app = request.app
    try:
        principal = await anyio.to_thread.run_sync(
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
    return principal.tenant


def _boundary(scope: Scope) -> bytes | None:
    """The multipart boundary as Starlette's parser reads it (python-multipart's
    ``parse_options_header`` on the first ``Content-Type``); ``None``: the parser refuses
    the body."""
    for name, value in scope.get("headers", []):
        if name == b"content-type":
            _, params = parse_options_header(value)
            boundary = params.get(b"boundary")
            return boundary or None
    return None


def _parts_counted(receive: Receive, boundary: bytes | None) -> Receive:
    """``receive`` that counts the form's delimiters as the body streams in and ends it in
    a 400 past :data:`MAX_UPLOAD_PARTS` parts (the closing delimiter is one more)."""
    if boundary is None:
        return receive
    delimiter = b"\r\n--" + boundary
    carry = b"\r\n"  # the first delimiter has no line break before it
    delimiters = 0

    async def counted() -> Message:
        nonlocal carry, delimiters
        message = await receive()
        if message["type"] != "http.request":
            return message
        window = carry + message.get("body", b"")
        delimiters += window.count(delimiter)
        carry = window[-(len(delimiter) - 1) :]
        if delimiters > MAX_UPLOAD_PARTS + 1:
            if message.get("more_body", False):
                await _drain_briefly(receive)
            # An HTTPException subclass: FastAPI re-raises it from form parsing and the
            # error handler renders the envelope.
            raise BadRequest(
                f"an upload's form has at most {MAX_UPLOAD_PARTS} parts; send the form's "
                f"fields and the adapter's files (or its one archive), nothing else",
                code="too_many_parts",
            )
        return message

    return counted
