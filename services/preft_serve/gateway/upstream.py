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
On the deployed transport they skip httpx altogether (:class:`DirectWorkerCalls`): the
``httpx.Request``, ``httpx.Response`` and the stream wrappers between the two libraries
cost ~0.1 ms of CPU per request more than aiohttp alone (docs/benchmarks.md). Tests with
a mock transport, and tracing (whose httpx instrumentation makes the client span), keep
the httpx path; both raise httpx's exceptions, so the proxy's retry rule is one.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from functools import lru_cache
from typing import Protocol

import aiohttp
import httpx
import yarl
from httpx_aiohttp import AiohttpTransport


class WorkerTransport(AiohttpTransport):
    """aiohttp-backed transport whose connect errors mean "nothing was sent"."""

    def __init__(self, max_connections: int, keepalive_s: float) -> None:
        super().__init__(
            limits=httpx.Limits(max_connections=max_connections, keepalive_expiry=keepalive_s),
            trust_env=False,
        )

    def session(self) -> aiohttp.ClientSession:
        """The aiohttp session under this transport (created on first use, in the running
        loop, as the base class does), for callers that skip httpx."""
        if not isinstance(self.client, aiohttp.ClientSession):
            self.client = self.get_client()
        return self.client

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


@lru_cache(maxsize=4096)
def _aiohttp_url(worker: str, path: str) -> yarl.URL:
    return yarl.URL(worker + path)


class WorkerCalls:
    """Completion requests to workers, sent straight to the client's transport.

    The transport is the one the gateway's ``httpx.AsyncClient`` was built on (so tracing's
    httpx instrumentation, which wraps that transport in place, still sees every call) and
    the client's timeouts apply. Health checks keep using the client.
    """

    def __init__(self, transport: httpx.AsyncBaseTransport, timeout: httpx.Timeout) -> None:
        self._transport = transport
        self._timeout = timeout.as_dict()

    async def post(
        self, worker: str, path: str, content: bytes, headers: dict[str, str]
    ) -> httpx.Response:
        """Send a POST; the answer's body is not read yet (``aread``/``aiter_bytes``)."""
        request = httpx.Request(
            "POST",
            _url(worker, path),
            content=content,
            headers=headers,
            extensions={"timeout": self._timeout},
        )
        return await self._transport.handle_async_request(request)


class WorkerAnswer(Protocol):
    """What the proxy reads of a worker's answer: ``httpx.Response`` has it, and so does
    :class:`DirectAnswer`."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def aread(self) -> bytes: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Calls(Protocol):
    async def post(
        self, worker: str, path: str, content: bytes, headers: dict[str, str]
    ) -> WorkerAnswer: ...


@contextlib.contextmanager
def httpx_errors() -> Iterator[None]:
    """aiohttp's errors as the httpx ones :class:`WorkerTransport` raises: connect errors
    only for failures to connect (nothing was sent), timeouts as timeouts, anything else
    on an open connection a protocol or read error (the worker may have the request)."""
    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:
        raise httpx.ConnectTimeout(str(exc)) from exc
    except aiohttp.ClientConnectorError as exc:
        raise httpx.ConnectError(str(exc)) from exc
    except (aiohttp.ServerTimeoutError, TimeoutError) as exc:
        raise httpx.ReadTimeout(str(exc)) from exc
    except aiohttp.ClientPayloadError as exc:
        raise httpx.ReadError(str(exc)) from exc
    except aiohttp.ClientError as exc:
        raise httpx.RemoteProtocolError(str(exc)) from exc


class DirectAnswer:
    """A worker's answer read straight from aiohttp (see :class:`WorkerAnswer`)."""

    __slots__ = ("_response", "headers", "status_code")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status_code: int = response.status
        self.headers: Mapping[str, str] = response.headers

    async def aread(self) -> bytes:
        with httpx_errors():
            return await self._response.read()

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        with httpx_errors():
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        """Back to the pool when read to the end; an unfinished answer closes its
        connection, which is how the worker learns to abort the request."""
        self._response.release()
        with httpx_errors():
            await self._response.wait_for_close()


class DirectWorkerCalls:
    """Completion requests on :class:`WorkerTransport`'s aiohttp session, without httpx
    (the same connection pool as the health checks; the client's timeouts)."""

    def __init__(self, transport: WorkerTransport, timeout: httpx.Timeout) -> None:
        self._transport = transport
        self._timeout = aiohttp.ClientTimeout(
            sock_connect=timeout.connect, sock_read=timeout.read, connect=timeout.pool
        )

    async def post(
        self, worker: str, path: str, content: bytes, headers: dict[str, str]
    ) -> DirectAnswer:
        with httpx_errors():
            response = await self._transport.session().request(
                "POST",
                _aiohttp_url(worker, path),
                data=content,
                headers=headers,
                allow_redirects=False,
                auto_decompress=False,
                compress=False,
                timeout=self._timeout,
            )
        return DirectAnswer(response)


def worker_calls(
    transport: httpx.AsyncBaseTransport, timeout: httpx.Timeout, traced: bool
) -> Calls:
    """The direct path on the deployed transport unless tracing wraps it."""
    if type(transport) is WorkerTransport and not traced:
        return DirectWorkerCalls(transport, timeout)
    return WorkerCalls(transport, timeout)
