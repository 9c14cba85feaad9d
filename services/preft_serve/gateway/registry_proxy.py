"""The tenant's files and fine-tuning calls, forwarded to the registry.

The registry owns files and fine-tuning jobs and checks the tenant's key itself; the
gateway forwards them so that one OpenAI base URL serves the whole flow (upload, train,
list models, chat). Bodies are streamed both ways, never buffered: an upload may be as
large as the registry accepts. The gateway's request id travels with the call, so both
services log the request under one id.
"""

from __future__ import annotations

import logging

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from preft_serve.common.access_log import REQUEST_ID_HEADER, request_id_of
from preft_serve.common.errors import ServiceError, ServiceUnavailable
from preft_serve.gateway.relay_response import RelayResponse
from preft_serve.gateway.settings import GatewaySettings

logger = logging.getLogger(__name__)

# The registry needs the key (it authenticates), the body's framing and the caller's
# preference; nothing else of the client's reaches it.
REQUEST_HEADERS = ("authorization", "content-type", "content-length", "accept")
# What the client needs of the answer (a 401's WWW-Authenticate, a 405's Allow, ...).
RESPONSE_HEADERS = ("content-type", "content-length", "content-encoding",
                    "content-disposition", "www-authenticate", "retry-after", "allow")


class RegistryNotConfigured(ServiceError):
    """These routes exist, but this deployment has no registry to forward them to."""

    http_status = 501
    code = "registry_not_configured"


def registry_http(settings: GatewaySettings) -> httpx.AsyncClient | None:
    """The gateway's one client for the registry (None when no registry is configured)."""
    if settings.registry_url is None:
        return None
    timeout = httpx.Timeout(settings.registry_timeout_s, connect=settings.connect_timeout_s)
    return httpx.AsyncClient(base_url=settings.registry_url, timeout=timeout)


async def forward(client: httpx.AsyncClient | None, request: Request) -> Response:
    """Send ``request`` to the registry as it came (path, query, key, body) and relay the
    answer, status and error envelope included."""
    client = _configured(client, request)
    headers = _headers(request, REQUEST_HEADERS)
    has_body = "content-length" in headers or "transfer-encoding" in request.headers
    raw_path = request.scope.get("raw_path") or request.url.path.encode()
    query = request.scope.get("query_string", b"")
    url = raw_path.decode("latin-1") + (f"?{query.decode('latin-1')}" if query else "")
    outgoing = client.build_request(request.method, url, headers=headers,
                                    content=request.stream() if has_body else None)
    try:
        answer = await client.send(outgoing, stream=True)
    except httpx.TransportError as exc:
        raise _unavailable(client, request, exc) from None
    kept = {name: value for name in RESPONSE_HEADERS
            if (value := answer.headers.get(name)) is not None}
    return RelayResponse(answer.aiter_raw(), status_code=answer.status_code, headers=kept,
                         background=BackgroundTask(answer.aclose))


async def call(client: httpx.AsyncClient | None, request: Request, method: str,
               path: str) -> httpx.Response:
    """A bodiless registry call of the gateway's own (another route than the request's),
    on the request's behalf: its key, its request id; the answer read whole."""
    client = _configured(client, request)
    headers = _headers(request, ("authorization", "accept"))
    try:
        return await client.request(method, path, headers=headers)
    except httpx.TransportError as exc:
        raise _unavailable(client, request, exc) from None


def _configured(client: httpx.AsyncClient | None, request: Request) -> httpx.AsyncClient:
    if client is None:
        raise RegistryNotConfigured(
            f"{request.url.path} is served by the registry, and this gateway has none "
            "configured; ask the operator to set PREFT_GATEWAY_REGISTRY_URL, or call the "
            "registry's URL directly")
    return client


def _headers(request: Request, names: tuple[str, ...]) -> dict[str, str]:
    headers = {name: value for name in names
               if (value := request.headers.get(name)) is not None}
    if (request_id := request_id_of(request)) is not None:
        headers[REQUEST_ID_HEADER] = request_id
    return headers


def _unavailable(client: httpx.AsyncClient, request: Request,
                 exc: httpx.TransportError) -> ServiceUnavailable:
    request.app.state.metrics.errors.labels("registry_unavailable").inc()
    logger.warning("registry %s unreachable for %s %s: %r", client.base_url,
                   request.method, request.url.path, exc)
    return ServiceUnavailable(
        f"the registry, which serves {request.url.path}, is not reachable ("
        f"{type(exc).__name__}); retry shortly, and if this persists ask the operator "
        "to check that the registry is running and that PREFT_GATEWAY_REGISTRY_URL "
        "points at it", code="registry_unavailable")
