"""Serving ``POST /v1/responses``, OpenAI's Responses API, which the workers (vLLM) serve.

The same steps as a completion (``completion_handler``): authenticate, validate
(``validation.validate_responses_body``), rate-limit, select the adapter, rewrite ``model``,
route, relay, count usage; only the shapes differ. ``input`` and ``max_output_tokens``
come in; a stream is typed events (``event: response.output_text.delta``), whose response
objects carry ``model`` (rewritten to the adapter's name) and, in the final one, ``usage``
as ``input_tokens`` / ``output_tokens``. A response is served whole on one worker, also
when the gateway has a decode pool.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
from fastapi import Request
from fastapi.responses import Response
from starlette.background import BackgroundTask

from preft_serve.common.access_log import request_id_of
from preft_serve.common.errors import BadRequest
from preft_serve.common.tenant_xarg import with_tenant
from preft_serve.gateway.completion_handler import admit, answer_whole
from preft_serve.gateway.deps import authenticate
from preft_serve.gateway.prompt_count import count_prompt
from preft_serve.gateway.proxy import SseSplitter, Upstream, open_upstream
from preft_serve.gateway.relay_response import RelayResponse
from preft_serve.gateway.request_record import RequestRecord
from preft_serve.gateway.state import GatewayState
from preft_serve.gateway.stream_bill import StreamBill, close_and_settle
from preft_serve.gateway.validation import (
    parse_body,
    validate_responses_body,
)

PATH = "/v1/responses"
# Events whose ``response`` object is final and carries the whole request's usage.
FINAL_EVENTS = (b"response.completed", b"response.incomplete", b"response.failed")
TEXT_EVENT = b"response.output_text.delta"
DELTA_EVENT = re.compile(rb"event: response\.[a-z_.]+\.delta\n")
TOOLS_OFF = (
    "tool calling is not enabled on this deployment: send the request without "
    "'tools' (or with 'tool_choice': \"none\"), or ask its operator to enable tool "
    "calling"
)
logger = logging.getLogger(__name__)


def check_tools(body: dict[str, Any], enabled: bool) -> None:
    """Refuse a request that asks for tool calls when the workers cannot parse them:
    vLLM's Responses server would answer it in plain text, ignoring ``tools`` and
    ``tool_choice``; its chat server refuses the same request (``proxy.worker_error``)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("'tools' must be a list of tools", param="tools")
    if choice is not None and not isinstance(choice, str | dict):
        raise BadRequest(
            '\'tool_choice\' must be "none", "auto", "required" or a tool', param="tool_choice"
        )
    if enabled or choice == "none":
        return
    if tools or choice not in (None, "auto"):
        raise BadRequest(
            TOOLS_OFF, code="tool_calling_disabled", param="tools" if tools else "tool_choice"
        )


def chat_usage(usage: Any) -> Any:
    """A Responses ``usage`` in the completions' words, which the counters read."""
    if not isinstance(usage, dict):
        return None
    return {
        "prompt_tokens": usage.get("input_tokens"),
        "completion_tokens": usage.get("output_tokens"),
    }


async def serve(request: Request) -> Response:
    """The whole request, counted once however it ends (``request_record``)."""
    state: GatewayState = request.app.state.gateway
    tenant = (await authenticate(state, request)).tenant
    with RequestRecord(state, tenant, request, PATH) as record:
        return await _serve(state, record, request)


async def _serve(state: GatewayState, record: RequestRecord, request: Request) -> Response:
    body = parse_body(await request.body(), state.caps.max_json_depth)
    output_tokens = validate_responses_body(body, state.caps)
    check_tools(body, state.settings.tool_calling)
    target = await admit(state, record, request, body, output_tokens)
    body["model"] = target.worker_model
    if target.classic is not None:  # the worker bounds each tenant's classic slots
        with_tenant(body, record.tenant)
    upstream = await open_upstream(
        state.calls,
        state.pool,
        target.routing_key,
        PATH,
        body,
        request_id_of(request),
        cold_tenant=target.cold_tenant,
        tenant=record.tenant,
        classic=target.classic,
    )
    status = record.answered(upstream)
    if body.get("stream") and status == 200:
        # Billed however the stream ends: vLLM reports usage only in the final event.
        bill = record.stream_bill(
            functools.partial(
                count_prompt, state, target.routing_key, body, "responses", request_id_of(request)
            )
        )
        return RelayResponse(
            relay_events(
                upstream, target.worker_model, target.public_name, bill, record.first_token
            ),
            status_code=200,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", **target.response_headers()},
            background=BackgroundTask(close_and_settle, upstream, bill),
        )
    response = await answer_whole(upstream, record, _usage_of, raw_media_type=False)
    response.headers.update(target.response_headers())
    return response


def _usage_of(payload: Any) -> Any:
    """A response object's ``usage``, in the completions' words."""
    return chat_usage(payload.get("usage")) if isinstance(payload, dict) else None


async def relay_events(
    upstream: Upstream,
    worker_model: str,
    public_name: str,
    bill: StreamBill,
    on_first_token: Callable[[], None],
) -> AsyncIterator[bytes]:
    """Pass the worker's events through one by one with ``model`` shown as the adapter's
    name (vLLM writes compact JSON, so it is swapped as bytes; an escaped quote inside
    generated text cannot match). Usage is counted once, from the final event; for a
    stream that ends before it (the client left, the worker broke) the bill counts the
    delta events relayed, one per decoding step of the worker."""
    old = b'"model":' + json.dumps(worker_model).encode()
    new = b'"model":' + json.dumps(public_name).encode()
    splitter, usage, seen_text = SseSplitter(), None, False
    try:
        async for chunk in upstream.response.aiter_bytes():
            out = []
            for raw in splitter.feed(chunk):
                event = raw.replace(old, new)
                if DELTA_EVENT.match(event):
                    bill.relayed_tokens += 1
                if not seen_text and TEXT_EVENT in event:
                    seen_text = True
                    on_first_token()
                if any(final in event for final in FINAL_EVENTS):
                    usage = _final_usage(event) or usage
                out.append(event + b"\n\n")
            if out:
                yield b"".join(out)
        if splitter.rest.strip():
            yield splitter.rest
    except httpx.HTTPError as exc:
        # Headers are sent: end the stream with the Responses API's error event.
        logger.warning("stream from %s broke: %s", upstream.worker, exc)
        error = {
            "type": "error",
            "code": "bad_gateway",
            "message": "the worker's stream broke",
            "param": None,
        }
        yield b"event: error\ndata: " + orjson.dumps(error) + b"\n\n"
    finally:
        if usage is not None:
            bill.usage(chat_usage(usage))
        await upstream.aclose()


def _final_usage(event: bytes) -> Any:
    """``response.usage`` of a final event (None when absent or unreadable)."""
    for line in event.split(b"\n"):
        if line.startswith(b"data: "):
            try:
                payload = orjson.loads(line[6:])
            except orjson.JSONDecodeError:
                return None
            response = payload.get("response") if isinstance(payload, dict) else None
            return response.get("usage") if isinstance(response, dict) else None
    return None
