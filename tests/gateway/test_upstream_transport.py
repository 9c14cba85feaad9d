"""The gateway's two ways to send a completion — straight on aiohttp (deployed) and
through httpx's API on the same aiohttp transport (tests, tracing) — behave alike against
a raw server, and both keep the proxy's retry rule: only a failure to connect is a
connect error (retried on the next worker, nothing was sent); a worker that took the
request and then dropped the connection is not (it may have started generating)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from preft_serve.gateway.proxy import RETRYABLE, open_upstream
from preft_serve.gateway.routing import WorkerPool
from preft_serve.gateway.upstream import (
    DirectWorkerCalls,
    WorkerAnswer,
    WorkerCalls,
    WorkerTransport,
    worker_calls,
)
from tests.support.ports import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _with_server(handler: Handler, body: Callable[[str], Awaitable[None]]) -> None:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await body(f"http://127.0.0.1:{port}")
    finally:
        server.close()
        await server.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    return head + await reader.readexactly(length)


Post = Callable[[str, bytes, dict[str, str]], Awaitable[WorkerAnswer]]


@contextlib.asynccontextmanager
async def _posting(direct: bool) -> AsyncIterator[Post]:
    """A ``post(url, body, headers)`` the way the gateway sends completions: on the direct
    path (deployed) or through httpx's API on the same transport (tests, tracing)."""
    transport = WorkerTransport(10, 2.0)
    timeout = httpx.Timeout(5.0)
    calls = worker_calls(transport, timeout, traced=not direct)
    assert isinstance(calls, DirectWorkerCalls) is direct

    async def post(url: str, body: bytes, headers: dict[str, str]) -> WorkerAnswer:
        return await calls.post(url, "/v1/completions", body, headers)

    try:
        yield post
    finally:
        await transport.aclose()


def test_the_deployed_transport_gets_the_direct_path_and_others_keep_httpx() -> None:
    timeout = httpx.Timeout(5.0)
    assert isinstance(
        worker_calls(WorkerTransport(1, 1.0), timeout, traced=False), DirectWorkerCalls
    )
    assert isinstance(worker_calls(WorkerTransport(1, 1.0), timeout, traced=True), WorkerCalls)
    mock = httpx.MockTransport(lambda request: httpx.Response(200))
    assert isinstance(worker_calls(mock, timeout, traced=False), WorkerCalls)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "httpx"])
def test_both_paths_refuse_retries_after_a_drop_but_retry_a_refusal(direct: bool) -> None:
    received: list[bytes] = []

    async def take_and_drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await _read_request(reader))
        writer.close()

    async def body(url: str) -> None:
        async with _posting(direct) as post:
            with pytest.raises(httpx.ConnectError) as refused:
                await post(f"http://127.0.0.1:{free_port()}", b"{}", {})
            assert isinstance(refused.value, RETRYABLE)
            with pytest.raises(httpx.HTTPError) as dropped:
                await post(url, b'{"prompt":"hi"}', {"Content-Type": "application/json"})
            assert not isinstance(dropped.value, RETRYABLE), repr(dropped.value)

    asyncio.run(_with_server(take_and_drop, body))
    assert received and received[0].endswith(b'{"prompt":"hi"}')


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "httpx"])
def test_both_paths_pass_streams_headers_and_bodies_through(direct: bool) -> None:
    events = [b'data: {"n":1}\n\n', b'data: {"n":2}\n\n', b"data: [DONE]\n\n"]
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        request = await _read_request(reader)  # 1: streamed
        assert b"x-request-id: r-1" in request.lower() and request.endswith(b'{"a":1}')
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nx-worker: w1\r\n\r\n"
        )
        for event in events:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await _read_request(reader)  # 2: whole, on the same (kept-alive) connection
        payload = b'{"error":"no"}'
        writer.write(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        await writer.drain()
        await reader.read()  # until the client closes
        writer.close()

    async def body(url: str) -> None:
        async with _posting(direct) as post:
            answer = await post(url, b'{"a":1}', {"X-Request-Id": "r-1"})
            got = b"".join([chunk async for chunk in answer.aiter_bytes()])
            await answer.aclose()
            assert answer.status_code == 200 and answer.headers.get("X-Worker") == "w1"
            assert got == b"".join(events)
            answer = await post(url, b"{}", {})
            assert answer.status_code == 400
            assert answer.headers.get("content-type") == "application/json"
            assert await answer.aread() == b'{"error":"no"}'
            await answer.aclose()

    asyncio.run(_with_server(serve, body))
    assert len(connections) == 1  # the finished stream's connection was reused


FIRST_EVENT = b'data: {"n":1}\n\n'


async def _start_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Take a request, answer with a chunked event stream and its first event."""
    await _read_request(reader)
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(FIRST_EVENT), FIRST_EVENT)
    )
    await writer.drain()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "httpx"])
def test_both_paths_raise_an_httpx_error_when_a_stream_breaks(direct: bool) -> None:
    async def break_off(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _start_stream(reader, writer)
        writer.close()  # no final chunk: the stream broke

    async def body(url: str) -> None:
        async with _posting(direct) as post:
            answer = await post(url, b"{}", {})
            got: list[bytes] = []
            with pytest.raises(httpx.HTTPError):
                async for chunk in answer.aiter_bytes():
                    got.append(chunk)
            await answer.aclose()
            assert b"".join(got) == FIRST_EVENT

    asyncio.run(_with_server(break_off, body))


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "httpx"])
def test_both_paths_close_the_connection_of_an_unfinished_stream(direct: bool) -> None:
    """How a worker learns that the client left: its connection closes (vLLM aborts)."""
    closed = asyncio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _start_stream(reader, writer)
        await reader.read()  # the stream never ends on its own: wait for the client's EOF
        closed.set()

    async def body(url: str) -> None:
        async with _posting(direct) as post:
            answer = await post(url, b"{}", {})
            async for _ in answer.aiter_bytes():
                break
            await answer.aclose()
            await asyncio.wait_for(closed.wait(), 5)

    asyncio.run(_with_server(endless, body))


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "httpx"])
def test_the_proxy_asks_workers_for_uncompressed_answers(direct: bool) -> None:
    """The answer is relayed and parsed as bytes, so the proxy must not be sent gzip: a
    worker (or a proxy in front of one) that compresses when offered it answers plain."""
    seen: list[bytes] = []

    async def compress_if_offered(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        request = await _read_request(reader)
        seen.append(request)
        head = request.split(b"\r\n\r\n")[0].lower()
        offered = next(
            (
                line.split(b":", 1)[1]
                for line in head.split(b"\r\n")
                if line.startswith(b"accept-encoding:")
            ),
            b"",
        )
        body, extra = b'{"ok":true}', b""
        if b"gzip" in offered:
            body, extra = gzip.compress(body), b"content-encoding: gzip\r\n"
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + extra
            + b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()

    async def body(url: str) -> None:
        transport = WorkerTransport(10, 2.0)
        try:
            calls = worker_calls(transport, httpx.Timeout(5.0), traced=not direct)
            pool = WorkerPool()
            pool.set_workers([url])
            upstream = await open_upstream(calls, pool, "key", "/v1/completions", {"a": 1})
            assert await upstream.response.aread() == b'{"ok":true}'
            await upstream.aclose()
        finally:
            await transport.aclose()

    asyncio.run(_with_server(compress_if_offered, body))
    assert b"accept-encoding: identity" in seen[0].lower()
