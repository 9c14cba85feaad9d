"""The HTTP transport the gateway talks to workers with: aiohttp under httpx's API.

httpx's own transport (httpcore over anyio) cost ~0.9 ms of CPU per proxied request on
these machines, the largest single part of the gateway's cost; the same request through
aiohttp costs ~0.4 ms under httpx's client API (``httpx-aiohttp``, the transport the openai
SDK ships as ``DefaultAioHttpClient``), see docs/benchmarks.md. httpx's API stays, so the
proxy, the health checks, tracing's httpx instrumentation and the tests' mock transports are
unchanged.

One correction on top: ``httpx-aiohttp`` maps every ``aiohttp.ClientConnectionError`` to
``httpx.ConnectTimeout``, a server that disconnects after the request was sent included.
The proxy retries connect failures on the next worker because nothing was sent; a
disconnect mid-request must not be retried (the worker may have started generating), so
only failures to connect stay connect errors here.

Completion requests skip httpx's client layer (:class:`WorkerCalls`): ``AsyncClient.send``
merges URLs, runs auth and redirect handling and extracts cookies on every call, a third
of the gateway's in-process CPU per request, for features calls to workers never use.
"""

from __future__ import annotations

from functools import lru_cache

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport


class WorkerTransport(AiohttpTransport):
    """aiohttp-backed transport whose connect errors mean "nothing was sent"."""

    def __init__(self, max_connections: int, keepalive_s: float) -> None:
        super().__init__(limits=httpx.Limits(max_connections=max_connections,
                                             keepalive_expiry=keepalive_s),
                         trust_env=False)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().handle_async_request(request)
        except httpx.ConnectTimeout as exc:
            cause = exc.__cause__
            if isinstance(cause, aiohttp.ConnectionTimeoutError):
                raise
            if isinstance(cause, aiohttp.ClientConnectorError):
                raise httpx.ConnectError(str(exc), request=request) from cause
            # Connected, then lost: the request may have reached the worker.
            raise httpx.RemoteProtocolError(str(exc), request=request) from cause


@lru_cache(maxsize=4096)
def _url(worker: str, path: str) -> httpx.URL:
    """Parsed once per worker and route (URL parsing is most of building a request)."""
    return httpx.URL(worker + path)


class WorkerCalls:
    """Completion requests to workers, sent straight to the client's transport.

    The transport is the one the gateway's ``httpx.AsyncClient`` was built on (so tracing's
    httpx instrumentation, which wraps that transport in place, still sees every call) and
    the client's timeouts apply. Health checks keep using the client.
    """

    def __init__(self, transport: httpx.AsyncBaseTransport, timeout: httpx.Timeout) -> None:
        self._transport = transport
        self._timeout = timeout.as_dict()

    async def post(self, worker: str, path: str, content: bytes,
                   headers: dict[str, str]) -> httpx.Response:
        """Send a POST; the answer's body is not read yet (``aread``/``aiter_bytes``)."""
        request = httpx.Request("POST", _url(worker, path), content=content, headers=headers,
                                extensions={"timeout": self._timeout})
        return await self._transport.handle_async_request(request)
