"""Serving one completion request: validate, select the adapter, route, proxy, count."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import redis
from fastapi import Request
from fastapi.responses import Response
from starlette.background import BackgroundTask

from preft_serve.common.access_log import access_fields, request_id_of
from preft_serve.common.errors import ServiceError
from preft_serve.gateway.metrics import token_counts
from preft_serve.gateway.proxy import (
    BadGateway,
    Upstream,
    open_upstream,
    relay_sse,
    rewrite_json,
    worker_error,
)
from preft_serve.gateway.relay_response import RelayResponse
from preft_serve.gateway.selection import select_target
from preft_serve.gateway.state import GatewayState
from preft_serve.gateway.validation import (
    parse_body,
    request_user,
    requested_model,
    validate_body,
)

NO_ADAPTER = "none"


async def handle(state: GatewayState, tenant: str, request: Request, path: str,
                 chat: bool) -> Response:
    """The whole request; every outcome is counted in ``requests_total``."""
    metrics, settings = state.metrics, state.settings
    start = time.perf_counter()
    label = NO_ADAPTER
    tenant_label = metrics.tenant_label(tenant)
    log = access_fields(request)
    try:
        body = parse_body(await request.body(), state.caps.max_json_depth)
        output_tokens = validate_body(body, chat=chat, caps=state.caps)
        user = request_user(body, request.headers.get("x-user-id"))
        log["user"] = user
        model = requested_model(body, settings.base_model_name)  # a 400 is never charged
        await state.limiter.check(tenant, user, output_tokens)
        target = await select_target(
            state.registry, tenant, model, user,
            base_name=settings.base_model_name, worker_base_model=settings.worker_model)
        log.update(target.log_fields())
        label = metrics.adapter_label(target.public_name)
        body["model"] = target.worker_model
        stream = bool(body.get("stream"))
        strip_usage, keep_chunk_usage = False, True
        if stream:  # counted from the worker's running totals, also if the stream ends early
            options = body.get("stream_options")
            options = dict(options) if isinstance(options, dict) else {}
            strip_usage = not options.get("include_usage")
            keep_chunk_usage = bool(options.get("continuous_usage_stats"))
            options["include_usage"] = options["continuous_usage_stats"] = True
            body["stream_options"] = options
        upstream = await open_upstream(state.calls, state.pool, target.routing_key, path, body,
                                       request_id_of(request))
    except ServiceError as exc:
        metrics.record_request(tenant_label, label, exc.status_code)
        metrics.errors.labels(exc.code).inc()
        raise
    except redis.RedisError:  # a lookup nothing cached: fast_path answers (and counts) 503
        metrics.record_request(tenant_label, label, 503)
        raise
    metrics.routing_of(upstream.result.value).inc()
    log["worker"] = upstream.worker
    status = upstream.response.status_code
    metrics.record_request(tenant_label, label, status)
    if status >= 400:
        metrics.errors.labels(f"worker_{status // 100}xx").inc()

    def on_usage(usage: Any) -> None:
        metrics.record_usage(label, usage, tenant_label)
        log_usage(log, usage)
        prompt, completion = token_counts(usage)
        state.usage.record(tenant, target.public_name, requests=1, prompt_tokens=prompt or 0,
                           completion_tokens=completion or 0)

    if stream and status == 200:
        def first_token() -> None:
            metrics.ttft_of(label).observe(time.perf_counter() - start)

        async def body_iter() -> Any:
            try:
                async for piece in relay_sse(upstream, target.worker_model, target.public_name,
                                             strip_usage, on_usage, first_token,
                                             keep_chunk_usage):
                    yield piece
            finally:
                metrics.latency_of(label).observe(time.perf_counter() - start)

        return RelayResponse(body_iter(), status_code=status,
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache",
                                      **target.response_headers()},
                             # Releases the worker slot even if the client left before
                             # the first byte (aclose is idempotent).
                             background=BackgroundTask(upstream.aclose))
    response = await _buffered(upstream, state, on_usage, target.public_name, start, label)
    response.headers.update(target.response_headers())
    return response


def log_usage(log: dict[str, Any], usage: Any) -> None:
    """Token counts for the access log (from a response's or the last chunk's usage)."""
    if isinstance(usage, dict):
        for field in ("prompt_tokens", "completion_tokens"):
            if isinstance(usage.get(field), int):
                log[field] = usage[field]


async def _buffered(upstream: Upstream, state: GatewayState, on_usage: Callable[[Any], None],
                    public_name: str, start: float, label: str) -> Response:
    """Read the worker's whole JSON answer, rewrite ``model``, count its usage."""
    try:
        raw = await upstream.response.aread()
    except httpx.HTTPError as exc:
        state.metrics.errors.labels("bad_gateway").inc()
        raise BadGateway(f"worker {upstream.worker} failed mid-response: "
                         f"{exc.__class__.__name__}") from None
    finally:
        await upstream.aclose()
    state.metrics.latency_of(label).observe(time.perf_counter() - start)
    status = upstream.response.status_code
    media_type = upstream.response.headers.get("content-type", "application/json")
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Response(raw, status_code=status, media_type=media_type)
    if status == 200:
        on_usage(payload.get("usage") if isinstance(payload, dict) else None)
        payload = rewrite_json(payload, public_name)
    elif status >= 400:
        payload = worker_error(payload, status) or payload
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")
