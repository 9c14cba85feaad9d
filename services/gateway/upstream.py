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
"""

from __future__ import annotations

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
