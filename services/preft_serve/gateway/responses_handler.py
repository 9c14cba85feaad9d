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

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
import redis
from fastapi import Request
from fastapi.responses import Response
from starlette.background import BackgroundTask

from preft_serve.common.access_log import access_fields, request_id_of
from preft_serve.common.errors import ServiceError
from preft_serve.gateway.completion_handler import (
    NO_ADAPTER,
    admit,
    record_answer,
    usage_counter,
)
from preft_serve.gateway.deps import authenticate
from preft_serve.gateway.proxy import (
    BadGateway,
    SseSplitter,
    Upstream,
    open_upstream,
    read_whole,
    rewrite_json,
    worker_error,
)
from preft_serve.gateway.relay_response import RelayResponse
from preft_serve.gateway.state import GatewayState
from preft_serve.gateway.validation import (
    parse_body,
    validate_responses_body,
)

PATH = "/v1/responses"
# Events whose ``response`` object is final and carries the whole request's usage.
FINAL_EVENTS = (b"response.completed", b"response.incomplete", b"response.failed")
TEXT_EVENT = b"response.output_text.delta"
logger = logging.getLogger(__name__)


def chat_usage(usage: Any) -> Any:
    """A Responses ``usage`` in the completions' words, which the counters read."""
    if not isinstance(usage, dict):
        return None
    return {"prompt_tokens": usage.get("input_tokens"),
            "completion_tokens": usage.get("output_tokens")}


async def serve(request: Request) -> Response:
    """The whole request; every outcome is counted in ``requests_total``."""
    state: GatewayState = request.app.state.gateway
    tenant = (await authenticate(state, request)).tenant
    metrics = state.metrics
    start = time.perf_counter()
    label, tenant_label, log = NO_ADAPTER, metrics.tenant_label(tenant), access_fields(request)
    try:
        body = parse_body(await request.body(), state.caps.max_json_depth)
        output_tokens = validate_responses_body(body, state.caps)
        target = await admit(state, tenant, request, body, output_tokens, log)
        label = metrics.adapter_label(target.public_name)
        body["model"] = target.worker_model
        upstream = await open_upstream(state.calls, state.pool, target.routing_key, PATH,
                                       body, request_id_of(request))
    except ServiceError as exc:
        metrics.record_request(tenant_label, label, exc.status_code)
        metrics.errors.labels(exc.code).inc()
        raise
    except redis.RedisError:  # the app's handler answers 503
        metrics.record_request(tenant_label, label, 503)
        raise
    status = record_answer(metrics, upstream, tenant_label, label, log)
    counted = usage_counter(state, tenant, tenant_label, target.public_name, label, log)

    def on_usage(usage: Any) -> None:
        counted(chat_usage(usage))

    if body.get("stream") and status == 200:
        def first_token() -> None:
            metrics.ttft_of(label).observe(time.perf_counter() - start)

        async def events() -> AsyncIterator[bytes]:
            try:
                async for piece in relay_events(upstream, target.worker_model,
                                                target.public_name, on_usage, first_token):
                    yield piece
            finally:
                metrics.latency_of(label).observe(time.perf_counter() - start)

        return RelayResponse(events(), status_code=200, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache",
                                      **target.response_headers()},
                             background=BackgroundTask(upstream.aclose))
    try:
        raw = await read_whole(upstream)
    except BadGateway:
        metrics.errors.labels("bad_gateway").inc()
        raise
    metrics.latency_of(label).observe(time.perf_counter() - start)
    response = _answer(raw, status, target.public_name, on_usage)
    response.headers.update(target.response_headers())
    return response


def _answer(raw: bytes, status: int, public_name: str,
            on_usage: Callable[[Any], None]) -> Response:
    """The worker's whole answer: ``model`` rewritten and usage counted, or its error in
    the gateway's envelope."""
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Response(raw, status_code=status)
    if status == 200 and isinstance(payload, dict):
        on_usage(payload.get("usage"))
        payload = rewrite_json(payload, public_name)
    elif status >= 400:
        payload = worker_error(payload, status) or payload
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


async def relay_events(upstream: Upstream, worker_model: str, public_name: str,
                       on_usage: Callable[[Any], None],
                       on_first_token: Callable[[], None]) -> AsyncIterator[bytes]:
    """Pass the worker's events through one by one with ``model`` shown as the adapter's
    name (vLLM writes compact JSON, so it is swapped as bytes; an escaped quote inside
    generated text cannot match). Usage is counted once, from the final event; a stream
    that ends before it (the client left, the worker broke) counts none."""
    old = b'"model":' + json.dumps(worker_model).encode()
    new = b'"model":' + json.dumps(public_name).encode()
    splitter, usage, seen_text = SseSplitter(), None, False
    try:
        async for chunk in upstream.response.aiter_bytes():
            out = []
            for raw in splitter.feed(chunk):
                event = raw.replace(old, new)
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
        error = {"type": "error", "code": "bad_gateway", "message": "the worker's stream broke",
                 "param": None}
        yield b"event: error\ndata: " + orjson.dumps(error) + b"\n\n"
    finally:
        if usage is not None:
            on_usage(usage)
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
