"""A worker stand-in that answers instantly, to measure the gateway's own cost.

Raw ASGI (no framework) under uvicorn: ``/health``, ``/v1/models`` (nothing resident),
the two completion endpoints, which return ``max_tokens`` one-character tokens at once, as
one JSON body or as one SSE event per token plus vLLM's usage chunk, and ``/v1/responses``
(``max_output_tokens`` characters, as one response object or vLLM's typed events), and
fixed answers for ``/tokenize``, ``/detokenize`` and ``/version``. With an
upstream this cheap, the time a request spends in the gateway is most of what is left.
JSON is compact, as vLLM writes it (pydantic's ``model_dump_json`` for stream chunks,
Starlette's ``JSONResponse`` for whole answers): the gateway rewrites ``model`` in such SSE
events as bytes and parses only the events that need it, so spaced JSON would make every
event look unusual and cost a parse, overstating the gateway's CPU.

    python -m uvicorn bench.fake_worker:app --port 9001 --no-access-log
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


async def _read_body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def _respond(
    send: Send, status: int, body: bytes, content_type: bytes = b"application/json"
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type)],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _completion(request: dict[str, Any], chat: bool) -> tuple[dict[str, Any], list[bytes]]:
    """The whole answer and its SSE events for ``request``."""
    tokens = int(request.get("max_tokens") or 16)
    created, model = int(time.time()), request.get("model", "fake")
    usage = {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens}
    kind = "chat.completion" if chat else "text_completion"
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "x" * tokens},
            "finish_reason": "length",
        }
    else:
        choice = {"index": 0, "text": "x" * tokens, "finish_reason": "length"}
    whole = {
        "id": "cmpl-fake",
        "object": kind,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }
    events = []
    for i in range(tokens):
        piece = (
            {"index": 0, "delta": {"content": "x"}, "finish_reason": None}
            if chat
            else {"index": 0, "text": "x", "finish_reason": None}
        )
        if i == tokens - 1:
            piece["finish_reason"] = "length"
        events.append(
            {
                "id": "cmpl-fake",
                "object": f"{kind}.chunk",
                "created": created,
                "model": model,
                "choices": [piece],
            }
        )
    if (request.get("stream_options") or {}).get("include_usage"):
        events.append(
            {
                "id": "cmpl-fake",
                "object": f"{kind}.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage,
            }
        )
    sse = [b"data: " + _json(e) + b"\n\n" for e in events]
    return whole, [*sse, b"data: [DONE]\n\n"]


def _response(request: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]:
    """A Responses API answer for ``request`` and its events, as vLLM writes them."""
    tokens = int(request.get("max_output_tokens") or 16)
    usage = {"input_tokens": 8, "output_tokens": tokens, "total_tokens": 8 + tokens}
    text = {"type": "output_text", "text": "x" * tokens, "annotations": []}
    whole = {
        "id": "resp_fake",
        "object": "response",
        "created_at": int(time.time()),
        "model": request.get("model", "fake"),
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_fake",
                "role": "assistant",
                "status": "completed",
                "content": [text],
            }
        ],
        "usage": usage,
    }
    events = [
        {
            "type": "response.created",
            "response": {**whole, "status": "in_progress", "output": [], "usage": None},
        }
    ]
    events += [
        {
            "type": "response.output_text.delta",
            "item_id": "msg_fake",
            "delta": "x",
            "output_index": 0,
            "content_index": 0,
        }
        for _ in range(tokens)
    ]
    events.append({"type": "response.completed", "response": whole})
    return whole, [
        b"event: " + e["type"].encode() + b"\ndata: " + _json({**e, "sequence_number": i}) + b"\n\n"
        for i, e in enumerate(events)
    ]


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path = scope["path"]
    if path == "/health":
        await _respond(send, 200, b"")
    elif path == "/v1/models":
        await _respond(send, 200, b'{"object": "list", "data": []}')
    elif path == "/version":
        await _respond(send, 200, b'{"version": "fake"}')
    elif path in ("/tokenize", "/detokenize") and scope["method"] == "POST":
        await _read_body(receive)  # vLLM's shapes, whatever was asked
        await _respond(
            send,
            200,
            b'{"tokens": [1, 2], "count": 2, "max_model_len": 256}'
            if path == "/tokenize"
            else b'{"prompt": "fake"}',
        )
    elif (
        path in ("/v1/chat/completions", "/v1/completions", "/v1/responses")
        and scope["method"] == "POST"
    ):
        request = json.loads(await _read_body(receive))
        whole, events = (
            _response(request)
            if path == "/v1/responses"
            else _completion(request, chat=path.endswith("chat/completions"))
        )
        if not request.get("stream"):
            await _respond(send, 200, _json(whole))
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    else:
        await _respond(
            send,
            404,
            b'{"error": {"message": "fake", "type": "NotFoundError", "param": null, "code": 404}}',
        )
