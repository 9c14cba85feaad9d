"""The tenant's registry calls, forwarded: files, fine-tuning, the audit log, adapters,
user bindings, usage and API keys.

The registry owns all of these; the gateway forwards them so that one base URL serves
everything a tenant does (upload data, train, manage adapters and bindings, read usage and
the audit log, chat). The gateway checks the key first, as on every other route, so a
keyless call is a 401 whatever the registry's state. Uploads (``POST /v1/files``,
``POST /v1/adapters``, ``PUT /v1/adapters/{name}``) are streamed to the registry, never
buffered (an upload may be as large as the registry accepts); other bodies are small (the
gateway's body limit) and are read whole before a registry connection is taken. Every call
takes one of its tenant's slots (``registry_slots``) and every body must keep arriving
(``body_pace``), so no tenant's slow or stalled calls hold the connections others need. The
gateway's request id travels with the call, so both services log the request under one id.

Client messages describe what happened, never this gateway's settings; the log names
them for the operator.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import httpx
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from preft_serve.common.access_log import REQUEST_ID_HEADER, request_id_of
from preft_serve.common.body_pace import BodyTooSlow, paced
from preft_serve.common.bodylimit import DRAIN_BYTES
from preft_serve.common.errors import NotFound, ServiceError, ServiceUnavailable
from preft_serve.common.registry_client import KeyOwner
from preft_serve.common.upload_routes import is_upload_route
from preft_serve.gateway.metrics import GatewayMetrics
from preft_serve.gateway.registry_slots import RETRY_AFTER, RegistrySlots
from preft_serve.gateway.relay_response import RelayResponse
from preft_serve.gateway.settings import GatewaySettings

logger = logging.getLogger(__name__)

# The registry needs the key (it authenticates), the body's framing, the caller's
# preference and a conditional change's precondition; nothing else of the client's reaches it.
REQUEST_HEADERS = ("authorization", "content-type", "content-length", "accept", "if-match")
# What the client needs of the answer (a 401's WWW-Authenticate, a 405's Allow, ...).
RESPONSE_HEADERS = (
    "content-type",
    "content-length",
    "content-encoding",
    "content-disposition",
    "www-authenticate",
    "retry-after",
    "allow",
    "location",
    "etag",
    "cache-control",
    "link",
)
RESPONSE_PREFIX = "x-preft-"  # the registry's own headers (an adapter's version, sha256)
# The tenant routes forwarded, by path prefix (the registry's; see gateway.routers).
FORWARDED = (
    "/v1/files",
    "/v1/fine_tuning/jobs",
    "/v1/audit",
    "/v1/adapters",
    "/v1/users",
    "/v1/usage",
    "/v1/keys",
)
DRAIN_S = 1.0  # longest read of a refused upload before its refusal is sent
CLIENT_LEFT = 499  # the access log's status for a client that left mid-body (nginx's)


class RegistryNotConfigured(ServiceError):
    """These routes exist, but this deployment has no registry to forward them to."""

    http_status = 501
    code = "registry_not_configured"


class RegistryForwarder:
    """The gateway's client for the registry, with the slots its calls take."""

    def __init__(self, settings: GatewaySettings, metrics: GatewayMetrics) -> None:
        assert settings.registry_url is not None
        # A call waits for a free connection no longer than for a new one: past that it
        # is a 503 saying the gateway is busy, not a long wait that reads as "down".
        timeout = httpx.Timeout(
            settings.registry_timeout_s,
            connect=settings.connect_timeout_s,
            pool=settings.connect_timeout_s,
        )
        limits = httpx.Limits(max_connections=settings.registry_connections)
        self.http = httpx.AsyncClient(
            base_url=settings.registry_url, timeout=timeout, limits=limits
        )
        self.connections = settings.registry_connections
        self.slots = RegistrySlots(
            settings.registry_tenant_calls,
            settings.registry_tenant_uploads,
            settings.registry_uploads,
            settings.registry_upload_reserve,
        )
        slots = self.slots
        metrics.watch_registry_calls(lambda: slots.uploading, lambda: slots.open - slots.uploading)
        self.idle_s = settings.upload_idle_timeout_s
        self.min_rate = settings.upload_min_bytes_per_s

    def body(self, request: Request) -> AsyncIterator[bytes]:
        return paced(request.stream(), self.idle_s, self.min_rate)

    async def aclose(self) -> None:
        await self.http.aclose()


def registry_http(settings: GatewaySettings, metrics: GatewayMetrics) -> RegistryForwarder | None:
    """The gateway's one forwarder to the registry (None when no registry is configured)."""
    if settings.registry_url is None:
        logger.info(
            "no registry configured (PREFT_GATEWAY_REGISTRY_URL unset): %s answer 501",
            ", ".join(FORWARDED),
        )
        return None
    return RegistryForwarder(settings, metrics)


async def forward(
    registry: RegistryForwarder | None, request: Request, owner: KeyOwner
) -> Response:
    """Send ``request`` to the registry as it came (path, query, key, body) and relay the
    answer, status and error envelope included. ``owner``: the key's tenant, whose slot the
    call takes until its answer is relayed."""
    registry = _configured(registry, request)
    _check_path(request)
    upload = is_upload_route(request.method, request.url.path)
    try:
        release = registry.slots.take(owner.tenant, upload)
    except ServiceError as refused:  # 429: the tenant's share; 503: all upload slots
        cause = "registry_share" if refused.status_code == 429 else refused.code
        request.app.state.metrics.errors.labels(cause).inc()
        if upload:
            await _drain(request)
        raise
    try:
        answer = await _send(registry, request, upload)
    except ClientDisconnect:
        release()
        # Nobody to answer; the registry saw its body cut short and stored nothing.
        logger.info("client left during %s %s", request.method, request.url.path)
        return Response(status_code=CLIENT_LEFT)
    except BaseException as exc:
        release()
        if isinstance(exc, BodyTooSlow):
            request.app.state.metrics.errors.labels(exc.code).inc()
        raise
    kept = {
        name: value for name in RESPONSE_HEADERS if (value := answer.headers.get(name)) is not None
    }
    kept.update(
        (name, value) for name, value in answer.headers.items() if name.startswith(RESPONSE_PREFIX)
    )
    return RelayResponse(
        answer.aiter_raw(),
        status_code=answer.status_code,
        headers=kept,
        background=BackgroundTask(_finish, answer, release),
    )


def family(path: str) -> str:
    """The forwarded prefix ``path`` is under (what a message may name of the path: the
    rest is the tenant's, unbounded)."""
    for prefix in FORWARDED:
        if path == prefix or path.startswith(prefix + "/"):
            return prefix
    return "this route"


def _check_path(request: Request) -> None:
    """A path with a ``.`` or ``..`` segment (or an empty one) could address another of
    the registry's routes once a client library normalises it: refused here."""
    segments = request.url.path.split("/")[1:]
    raw = (request.scope.get("raw_path") or b"").decode("latin-1").lower()
    if any(s in ("", ".", "..") for s in segments) or "%2e" in raw or "%2f" in raw:
        raise NotFound(
            f"no such route under {family(request.url.path)}: a path segment is empty, "
            "'.' or '..', or an escaped '.' or '/'"
        )


async def call(
    registry: RegistryForwarder | None,
    request: Request,
    method: str,
    path: str,
    json: object = None,
    if_match: str | None = None,
) -> httpx.Response:
    """A registry call of the gateway's own (another route than the request's), on the
    request's behalf: its key, its request id, a small JSON body if any, the precondition
    ``if_match`` if any; the answer read whole."""
    registry = _configured(registry, request)
    headers = _headers(request, ("authorization", "accept"))
    if if_match is not None:
        headers["if-match"] = if_match
    try:
        return await registry.http.request(method, path, headers=headers, json=json)
    except httpx.TransportError as exc:
        raise _unavailable(registry, request, exc) from None


async def _send(registry: RegistryForwarder, request: Request, upload: bool) -> httpx.Response:
    headers = _headers(request, REQUEST_HEADERS)
    content: AsyncIterator[bytes] | bytes | None = None
    if "content-length" in headers or "transfer-encoding" in request.headers:
        if upload:
            content = registry.body(request)
        else:  # small (the body limit): read before a connection is taken
            content = b"".join([chunk async for chunk in registry.body(request)])
            headers["content-length"] = str(len(content))
    raw_path = request.scope.get("raw_path") or request.url.path.encode()
    query = request.scope.get("query_string", b"")
    url = raw_path.decode("latin-1") + (f"?{query.decode('latin-1')}" if query else "")
    outgoing = registry.http.build_request(request.method, url, headers=headers, content=content)
    try:
        return await registry.http.send(outgoing, stream=True)
    except httpx.TransportError as exc:
        raise _unavailable(registry, request, exc) from None


async def _finish(answer: httpx.Response, release: Callable[[], None]) -> None:
    try:
        await answer.aclose()
    finally:
        release()


async def _drain(request: Request) -> None:
    """Read (and drop) what arrives of a refused upload within a second, so the refusal
    reaches a client still sending rather than a reset (see ``bodylimit.DRAIN_BYTES``);
    a stalled one gets it at once."""
    received = 0

    async def read() -> None:
        nonlocal received
        async for chunk in request.stream():
            received += len(chunk)
            if received > DRAIN_BYTES:
                return

    try:
        await asyncio.wait_for(read(), DRAIN_S)
    except Exception:  # noqa: BLE001 - timed out, or the client left: the refusal goes out
        return


def _configured(registry: RegistryForwarder | None, request: Request) -> RegistryForwarder:
    if registry is None:
        raise RegistryNotConfigured(
            f"{request.url.path} is not enabled on this deployment: it has no fine-tuning "
            "service (adapter registry) behind this endpoint"
        )
    return registry


def _headers(request: Request, names: tuple[str, ...]) -> httpx.Headers:
    """The client's ``names`` headers for the registry, as the bytes they came as (httpx
    would refuse a text value outside ASCII, which a client may well send)."""
    headers = httpx.Headers(
        [
            (name.encode(), value.encode("latin-1"))
            for name in names
            if (value := request.headers.get(name)) is not None
        ]
    )
    if (request_id := request_id_of(request)) is not None:
        headers[REQUEST_ID_HEADER] = request_id
    return headers


def _unavailable(
    registry: RegistryForwarder, request: Request, exc: httpx.TransportError
) -> ServiceUnavailable:
    cause = "registry_busy" if isinstance(exc, httpx.PoolTimeout) else "registry_unavailable"
    request.app.state.metrics.errors.labels(cause).inc()
    if isinstance(exc, httpx.PoolTimeout):
        logger.warning(
            "all %d registry connections busy for %s %s (raise "
            "PREFT_GATEWAY_REGISTRY_CONNECTIONS or add replicas)",
            registry.connections,
            request.method,
            request.url.path,
        )
        return ServiceUnavailable(
            f"all of this gateway's {registry.connections} connections to the adapter "
            "registry are in use; retry shortly",
            code="registry_busy",
            headers=RETRY_AFTER,
        )
    logger.warning(
        "registry %s unreachable for %s %s (check that it runs and that "
        "PREFT_GATEWAY_REGISTRY_URL points at it): %r",
        registry.http.base_url,
        request.method,
        request.url.path,
        exc,
    )
    return ServiceUnavailable(
        f"the adapter registry, which serves {family(request.url.path)}, is unreachable; "
        "try again later",
        code="registry_unavailable",
    )
