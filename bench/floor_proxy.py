"""The least any Python proxy costs on this machine: the gateway's CPU floor.

A raw ASGI app under the same uvicorn (uvloop, httptools) as the gateway, with the
gateway's upstream client library (aiohttp, one pooled session), that does only what no
gateway can skip: read the body, parse it, rewrite ``model``, send it upstream and relay
the answer (streamed answers chunk by chunk, as bytes). No authentication, routing, rate
limits, usage counters, metrics or logs. ``make bench-gateway`` measures it in front of the
instant upstream beside the real gateway, so the gateway's CPU per request can be read
against what a server plus a client cost here before any gateway logic.

    PREFT_FLOOR_UPSTREAM=http://127.0.0.1:9001 \\
        python -m uvicorn bench.floor_proxy:app --port 9002 --no-access-log
"""

from __future__ import annotations

import os
from typing import Any

import aiohttp
import orjson

from bench.fake_worker import Receive, Scope, Send, _read_body

UPSTREAM = os.environ.get("PREFT_FLOOR_UPSTREAM", "http://127.0.0.1:9001")


class _Upstream:
    """The one pooled client session, opened and closed by the lifespan."""

    session: aiohttp.ClientSession | None = None


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            _Upstream.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=60)
            )
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if _Upstream.session is not None:
                await _Upstream.session.close()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    session = _Upstream.session
    if scope["type"] != "http" or session is None:
        return
    payload: dict[str, Any] = orjson.loads(await _read_body(receive))
    payload["model"] = str(payload.get("model", ""))  # the one rewrite every gateway does
    async with session.post(
        UPSTREAM + scope["path"],
        data=orjson.dumps(payload),
        headers={"content-type": "application/json"},
    ) as upstream:
        content_type = upstream.headers.get("content-type", "application/json").encode()
        await send(
            {
                "type": "http.response.start",
                "status": upstream.status,
                "headers": [(b"content-type", content_type)],
            }
        )
        async for chunk in upstream.content.iter_any():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
