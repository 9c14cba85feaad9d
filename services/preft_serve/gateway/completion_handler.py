"""Serving one completion request: validate, select the adapter, route, proxy, count."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
import redis
from fastapi import Request
from fastapi.responses import Response
from starlette.background import BackgroundTask

from preft_serve.common.access_log import access_fields, request_id_of
from preft_serve.common.errors import ServiceError, ServiceUnavailable
from preft_serve.gateway.handoff import FirstToken, Handoff, unified_reason
from preft_serve.gateway.metrics import GatewayMetrics, token_counts
from preft_serve.gateway.proxy import (
    BadGateway,
    Upstream,
    open_upstream,
    read_whole,
    relay_sse,
    rewrite_json,
    worker_error,
)
from preft_serve.gateway.relay_response import RelayResponse
from preft_serve.gateway.selection import Target, select_target
from preft_serve.gateway.state import GatewayState
from preft_serve.gateway.validation import (
    parse_body,
    request_user,
    requested_model,
    validate_body,
)

NO_ADAPTER = "none"
logger = logging.getLogger(__name__)


async def handle(state: GatewayState, tenant: str, request: Request, path: str,
                 chat: bool) -> Response:
    """The whole request; every outcome is counted in ``requests_total``."""
    metrics = state.metrics
    start = time.perf_counter()
    label = NO_ADAPTER
    tenant_label = metrics.tenant_label(tenant)
    log = access_fields(request)
    try:
        body = parse_body(await request.body(), state.caps.max_json_depth)
        output_tokens = validate_body(body, chat=chat, caps=state.caps)
        target = await admit(state, tenant, request, body, output_tokens, log)
        label = metrics.adapter_label(target.public_name)
        body["model"] = target.worker_model
        if state.decode_pool is not None:
            reason = unified_reason(body, chat, target)
            if reason is None:
                handoff = Handoff(state, target, body, chat, path, request_id_of(request))
                served = await _two_pools(state, handoff, tenant, tenant_label, label, log,
                                          start)
                if served is not None:
                    return served
                metrics.handoffs.labels("fallback").inc()
            else:
                metrics.unified.labels(reason).inc()
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
    status = record_answer(metrics, upstream, tenant_label, label, log)

    on_usage = usage_counter(state, tenant, tenant_label, target.public_name, label, log)

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


def usage_counter(state: GatewayState, tenant: str, tenant_label: str, public_name: str,
                  label: str, log: dict[str, Any]) -> Callable[[Any], None]:
    """What counts a request's usage (metrics, access log, per-day usage) once it is known."""
    def on_usage(usage: Any) -> None:
        state.metrics.record_usage(label, usage, tenant_label)
        log_usage(log, usage)
        prompt, completion = token_counts(usage)
        state.usage.record(tenant, public_name, requests=1, prompt_tokens=prompt or 0,
                           completion_tokens=completion or 0)
    return on_usage


async def admit(state: GatewayState, tenant: str, request: Request, body: dict[str, Any],
                output_tokens: int, log: dict[str, Any]) -> Target:
    """What a validated request runs, once its rate limit lets it in: its user (the body's
    or the ``X-User-Id`` header) and the adapter that user or ``model`` selects. The model
    is read before the limit is charged, so a request refused for its model costs nothing."""
    settings = state.settings
    user = request_user(body, request.headers.get("x-user-id"))
    log["user"] = user
    model = requested_model(body, settings.base_model_name)
    await state.limiter.check(tenant, user, output_tokens)
    target = await select_target(
        state.registry, tenant, model, user,
        base_name=settings.base_model_name, worker_base_model=settings.worker_model,
        unbound_user=functools.partial(state.serving.unbound_user, tenant))
    log.update(target.log_fields())
    return target


def record_answer(metrics: GatewayMetrics, upstream: Upstream, tenant_label: str, label: str,
                  log: dict[str, Any]) -> int:
    """Count a worker's answer (where it was routed, its status) and log the worker; its
    status."""
    metrics.routing_of(upstream.result.value).inc()
    log["worker"] = upstream.worker
    status = upstream.response.status_code
    metrics.record_request(tenant_label, label, status)
    if status >= 400:
        metrics.errors.labels(f"worker_{status // 100}xx").inc()
    return status


async def _two_pools(state: GatewayState, handoff: Handoff, tenant: str, tenant_label: str,
                     label: str, log: dict[str, Any], start: float) -> Response | None:
    """Serve the request as a prefill hop and a decode hop (``gateway.handoff``); None when
    it must be served whole instead (no decode worker reachable, or the adapter's worker
    is not a prefill worker). Errors of the prefill hop propagate as without a decode pool."""
    metrics, target = state.metrics, handoff.target
    prefilled, raw = await handoff.prefill()
    metrics.routing_of(prefilled.result.value).inc()
    log["worker"] = prefilled.worker
    status = prefilled.response.status_code
    on_usage = usage_counter(state, tenant, tenant_label, target.public_name, label, log)
    if status != 200:
        return _worker_refusal(state, raw, status, tenant_label, label)
    try:
        first = FirstToken.parse(orjson.loads(raw), handoff.chat)
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        # Counted as bad_gateway by the caller, like every ServiceError before a response.
        raise BadGateway(f"worker {prefilled.worker} answered the prefill hop with "
                         "something other than a completion") from None
    if first.complete:
        metrics.handoffs.labels("first_token").inc()
        return _answer(state, handoff, first, None, on_usage, tenant_label, label, start)
    if not first.handed_off:
        logger.warning("worker %s kept no KV for a decode worker: start the workers a "
                       "decode pool serves with --role prefill", prefilled.worker)
        return None
    if handoff.stop_may_span(first):
        return None
    handed_at = time.perf_counter()
    try:
        decoding = await handoff.open_decode(first)
    except ServiceUnavailable as exc:
        logger.warning("decode pool unavailable, serving whole on %s: %s",
                       prefilled.worker, exc)
        return None
    metrics.handoff_seconds.observe(time.perf_counter() - handed_at)
    log["decode_worker"] = decoding.worker
    status = decoding.response.status_code
    if status != 200:
        raw = await decoding.response.aread()
        await decoding.aclose()
        metrics.handoffs.labels("decode_failed").inc()
        return _worker_refusal(state, raw, status, tenant_label, label)
    metrics.handoffs.labels("decoded").inc()
    if not handoff.stream:
        raw = await read_whole(decoding, "decode worker")
        return _answer(state, handoff, first, orjson.loads(raw), on_usage, tenant_label,
                       label, start)
    metrics.record_request(tenant_label, label, 200)

    async def body_iter() -> Any:
        try:
            yield b"".join(handoff.first_events(first))
            metrics.ttft_of(label).observe(time.perf_counter() - start)
            async for piece in handoff.relay_decode(first, decoding, on_usage):
                yield piece
        finally:
            metrics.latency_of(label).observe(time.perf_counter() - start)

    return RelayResponse(body_iter(), status_code=200, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", **target.response_headers()},
                         background=BackgroundTask(decoding.aclose))


def _worker_refusal(state: GatewayState, raw: bytes, status: int, tenant_label: str,
                    label: str) -> Response:
    """A worker's error answer, in the gateway's envelope, as the client's answer."""
    state.metrics.record_request(tenant_label, label, status)
    state.metrics.errors.labels(f"worker_{status // 100}xx").inc()
    try:
        payload = worker_error(orjson.loads(raw), status)
    except orjson.JSONDecodeError:
        payload = None
    if payload is None:
        return Response(raw, status_code=status)
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def _answer(state: GatewayState, handoff: Handoff, first: FirstToken,
            decoded: dict[str, Any] | None, on_usage: Callable[[Any], None],
            tenant_label: str, label: str, start: float) -> Response:
    """The two hops' answer as one (streamed when the client asked for a stream)."""
    answer = handoff.answer(first, decoded)
    on_usage(answer.get("usage"))
    state.metrics.record_request(tenant_label, label, 200)
    state.metrics.latency_of(label).observe(time.perf_counter() - start)
    headers = handoff.target.response_headers()
    if not handoff.stream:
        return Response(orjson.dumps(answer), media_type="application/json", headers=headers)
    events = handoff.first_events(first)
    if handoff.include_usage and answer.get("usage"):
        events.append(handoff.usage_event(first, answer["usage"]))
    events.append(b"data: [DONE]\n\n")
    return Response(b"".join(events), media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache", **headers})


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
        raw = await read_whole(upstream)
    except BadGateway:  # after the request was counted: its failure is counted here
        state.metrics.errors.labels("bad_gateway").inc()
        raise
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
