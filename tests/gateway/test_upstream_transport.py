"""The gateway's aiohttp transport keeps the proxy's retry rule: only a failure to connect
is a connect error (retried on the next worker, nothing was sent); a worker that took the
request and then dropped the connection is not (it may have started generating)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest
from preft_serve.gateway.proxy import RETRYABLE
from preft_serve.gateway.upstream import WorkerTransport

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
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head + await reader.readexactly(length)


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=WorkerTransport(10, 2.0), timeout=5)


def test_refused_connection_is_a_retryable_connect_error() -> None:
    async def main() -> None:
        async with _client() as client:
            with pytest.raises(httpx.ConnectError) as info:
                await client.post(f"http://127.0.0.1:{free_port()}/v1/completions", json={})
            assert isinstance(info.value, RETRYABLE)

    asyncio.run(main())


def test_a_drop_after_the_request_was_sent_is_not_retryable() -> None:
    received: list[bytes] = []

    async def take_and_drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await _read_request(reader))
        writer.close()

    async def body(url: str) -> None:
        async with _client() as client:
            with pytest.raises(httpx.HTTPError) as info:
                await client.post(f"{url}/v1/completions", json={"prompt": "hi"})
            assert not isinstance(info.value, RETRYABLE), repr(info.value)

    asyncio.run(_with_server(take_and_drop, body))
    assert received and received[0].endswith(b'{"prompt":"hi"}')


def test_streams_and_headers_pass_through() -> None:
    events = [b'data: {"n":1}\n\n', b'data: {"n":2}\n\n', b"data: [DONE]\n\n"]

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await _read_request(reader)
        assert b"x-request-id: r-1" in request.lower()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\nx-worker: w1\r\n\r\n")
        for event in events:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def body(url: str) -> None:
        async with _client() as client:
            request = client.build_request("POST", f"{url}/v1/completions", json={},
                                           headers={"X-Request-Id": "r-1"})
            response = await client.send(request, stream=True)
            got = b"".join([chunk async for chunk in response.aiter_bytes()])
            await response.aclose()
            assert response.status_code == 200 and response.headers["x-worker"] == "w1"
            assert got == b"".join(events)

    asyncio.run(_with_server(stream, body))
