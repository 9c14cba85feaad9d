"""Serving one completion request: validate, select the adapter, route, proxy; what
happened goes on its record (``request_record``), which counts it once."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response
from starlette.background import BackgroundTask

from preft_serve.common.access_log import request_id_of
from preft_serve.common.errors import ServiceUnavailable
from preft_serve.common.registry_client import split_pinned
from preft_serve.common.tenant_xarg import with_tenant
from preft_serve.common.version_split import Variant, pick
from preft_serve.gateway.handoff import FirstToken, Handoff, unified_reason
from preft_serve.gateway.prompt_count import count_prompt
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
from preft_serve.gateway.request_record import RequestRecord
from preft_serve.gateway.selection import Target, adapter_target, select_target
from preft_serve.gateway.state import GatewayState
from preft_serve.gateway.stream_bill import close_and_settle
from preft_serve.gateway.validation import (
    parse_body,
    request_user,
    requested_model,
    validate_body,
)

logger = logging.getLogger(__name__)


async def handle(
    state: GatewayState, tenant: str, request: Request, path: str, chat: bool
) -> Response:
    """The whole request, counted once however it ends (``request_record``)."""
    with RequestRecord(state, tenant, request, path) as record:
        return await _serve(state, record, request, path, chat)


async def _serve(
    state: GatewayState, record: RequestRecord, request: Request, path: str, chat: bool
) -> Response:
    body = parse_body(await request.body(), state.caps.max_json_depth)
    output_tokens = validate_body(body, chat=chat, caps=state.caps)
    target = await admit(state, record, request, body, output_tokens)
    body["model"] = target.worker_model
    if target.classic is not None:  # the worker bounds each tenant's classic slots
        with_tenant(body, record.tenant)
    if state.decode_pool is not None:
        reason = unified_reason(body, chat, target)
        if reason is None:
            handoff = Handoff(
                state, target, body, chat, path, request_id_of(request), record.tenant
            )
            served = await _two_pools(state, handoff, record)
            if served is not None:
                return served
            state.metrics.handoffs.labels("fallback").inc()
        else:
            state.metrics.unified.labels(reason).inc()
    stream = bool(body.get("stream"))
    strip_usage, keep_chunk_usage = False, True
    if stream:  # counted from the worker's running totals, also if the stream ends early
        options = body.get("stream_options")
        options = dict(options) if isinstance(options, dict) else {}
        strip_usage = not options.get("include_usage")
        keep_chunk_usage = bool(options.get("continuous_usage_stats"))
        options["include_usage"] = options["continuous_usage_stats"] = True
        body["stream_options"] = options
    upstream = await open_upstream(
        state.calls,
        state.pool,
        target.routing_key,
        path,
        body,
        request_id_of(request),
        cold_tenant=target.cold_tenant,
        tenant=record.tenant,
        classic=target.classic,
    )
    status = record.answered(upstream)
    if stream and status == 200:
        # The worker has the request: it is billed however the stream ends (stream_bill).
        bill = record.stream_bill(
            functools.partial(
                count_prompt,
                state,
                target.routing_key,
                body,
                "chat" if chat else "completion",
                request_id_of(request),
            )
        )
        return RelayResponse(
            relay_sse(
                upstream,
                target.worker_model,
                target.public_name,
                strip_usage,
                bill.usage,
                record.first_token,
                keep_chunk_usage,
            ),
            status_code=status,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", **target.response_headers()},
            # Releases the worker slot and bills the request even if the
            # client left before the first byte (aclose is idempotent).
            background=BackgroundTask(close_and_settle, upstream, bill),
        )
    response = await answer_whole(upstream, record, usage_of)
    response.headers.update(target.response_headers())
    return response


def usage_of(payload: Any) -> Any:
    """A completion's ``usage``."""
    return payload.get("usage") if isinstance(payload, dict) else None


async def admit(
    state: GatewayState,
    record: RequestRecord,
    request: Request,
    body: dict[str, Any],
    output_tokens: int,
) -> Target:
    """What a validated request runs, once its rate limit lets it in: its user (the body's
    or the ``X-User-Id`` header) and the adapter that user or ``model`` selects, in the
    version the adapter's serving policy gives that user. The model is read, and the
    tenant's open-request share checked (it is taken when the request is routed), before
    the limit is charged, so a request refused for either costs nothing."""
    settings = state.settings
    state.pool.tenant_open.check(record.tenant)
    user, model = await charge(state, record.tenant, request, body, output_tokens, record.log)
    target = await select_target(
        state.registry,
        record.tenant,
        model,
        user,
        base_name=settings.base_model_name,
        worker_base_model=settings.worker_model,
        unbound_user=functools.partial(state.serving.unbound_user, record.tenant),
    )
    target, variant = policy_version(target, model, user)
    record.selected(target, None if target.adapter is None else variant.value)
    if record.variant is not None:
        state.metrics.variant_of(record.adapter, record.variant).inc()
    return target


def policy_version(target: Target, model: str | None, user: str | None) -> tuple[Target, Variant]:
    """The version of the selected adapter that ``user`` gets under its serving policy
    (``common.version_split``; the registry answers the same for ``?user=``). Decided
    here, once: the two-pool hops and streams only relay this target."""
    ref = target.adapter
    if ref is None:
        return target, Variant.SERVING
    if model is not None and split_pinned(model) is not None:
        return target, Variant.PINNED
    chosen, variant = pick(ref, user)
    return (target if chosen is ref else adapter_target(chosen)), variant


async def charge(
    state: GatewayState,
    tenant: str,
    request: Request,
    body: dict[str, Any],
    output_tokens: int,
    log: dict[str, Any],
) -> tuple[str | None, str | None]:
    """Charge a request to its tenant's and user's rate limits (429 when over); its user
    and the model it names. Every route that reaches a worker is charged here, so a tenant
    over its limit is refused alike on each."""
    user = request_user(body, request.headers.get("x-user-id"))
    log["user"] = user
    model = requested_model(body, state.settings.base_model_name)
    await state.limiter.check(tenant, user, output_tokens)
    return user, model


async def answer_whole(
    upstream: Upstream,
    record: RequestRecord,
    usage: Callable[[Any], Any],
    raw_media_type: bool = True,
) -> Response:
    """Read the worker's whole JSON answer, rewrite ``model``, bill its usage (``usage``
    reads it from the answer); a worker's error in the gateway's envelope. An answer that
    is not JSON is passed on as it is (with the worker's content type when
    ``raw_media_type``)."""
    raw = await read_whole(upstream)
    status = upstream.response.status_code
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        media_type = (
            upstream.response.headers.get("content-type", "application/json")
            if raw_media_type
            else None
        )
        return Response(raw, status_code=status, media_type=media_type)
    if status == 200:
        record.bill(usage(payload))
        payload = rewrite_json(payload, record.target.public_name if record.target else "")
    elif status >= 400:
        payload = worker_error(payload, status) or payload
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


async def _two_pools(
    state: GatewayState, handoff: Handoff, record: RequestRecord
) -> Response | None:
    """Serve the request as a prefill hop and a decode hop (``gateway.handoff``); None when
    it must be served whole instead (no decode worker reachable, or the adapter's worker
    is not a prefill worker). Errors of the prefill hop propagate as without a decode pool."""
    metrics, target = state.metrics, handoff.target
    prefilled, raw = await handoff.prefill()
    status = record.answered(prefilled)
    if status != 200:
        return _worker_refusal(raw, status)
    try:
        first = FirstToken.parse(orjson.loads(raw), handoff.chat)
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        # Counted as bad_gateway by the record, like every ServiceError before a response.
        raise BadGateway(
            f"worker {prefilled.worker} answered the prefill hop with "
            "something other than a completion"
        ) from None
    if first.complete:
        metrics.handoffs.labels("first_token").inc()
        return _answer(handoff, first, None, record)
    if not first.handed_off:
        logger.warning(
            "worker %s kept no KV for a decode worker: start the workers a "
            "decode pool serves with --role prefill",
            prefilled.worker,
        )
        return None
    if handoff.stop_may_span(first):
        return None
    handed_at = time.perf_counter()
    try:
        decoding = await handoff.open_decode(first)
    except ServiceUnavailable as exc:
        logger.warning("decode pool unavailable, serving whole on %s: %s", prefilled.worker, exc)
        return None
    metrics.handoff_seconds.observe(time.perf_counter() - handed_at)
    status = record.decoded(decoding)
    if status != 200:
        try:
            raw = await decoding.response.aread()
        finally:  # releases the worker's slot and the tenant's share, however it ends
            await decoding.aclose()
        metrics.handoffs.labels("decode_failed").inc()
        return _worker_refusal(raw, status)
    metrics.handoffs.labels("decoded").inc()
    if not handoff.stream:
        raw = await read_whole(decoding, "decode worker")
        return _answer(handoff, first, orjson.loads(raw), record)
    prompt_tokens = len(first.prompt_ids) or _prefill_prompt_tokens(first)

    async def prefilled_prompt() -> int | None:  # the prefill hop counted it already
        return prompt_tokens

    bill = record.stream_bill(prefilled_prompt)
    bill.relayed_tokens = len(first.token_ids)  # sent in the first events

    async def body_iter() -> Any:
        yield b"".join(handoff.first_events(first))
        record.first_token()
        async for piece in handoff.relay_decode(first, decoding, bill.usage):
            yield piece

    return RelayResponse(
        body_iter(),
        status_code=200,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", **target.response_headers()},
        background=BackgroundTask(close_and_settle, decoding, bill),
    )


def _prefill_prompt_tokens(first: FirstToken) -> int | None:
    usage = first.payload.get("usage")
    count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return count if isinstance(count, int) else None


def _worker_refusal(raw: bytes, status: int) -> Response:
    """A worker's error answer, in the gateway's envelope, as the client's answer."""
    try:
        payload = worker_error(orjson.loads(raw), status)
    except orjson.JSONDecodeError:
        payload = None
    if payload is None:
        return Response(raw, status_code=status)
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def _answer(
    handoff: Handoff, first: FirstToken, decoded: dict[str, Any] | None, record: RequestRecord
) -> Response:
    """The two hops' answer as one (streamed when the client asked for a stream)."""
    answer = handoff.answer(first, decoded)
    record.bill(answer.get("usage"))
    headers = handoff.target.response_headers()
    if not handoff.stream:
        return Response(orjson.dumps(answer), media_type="application/json", headers=headers)
    events = handoff.first_events(first)
    if handoff.include_usage and answer.get("usage"):
        events.append(handoff.usage_event(first, answer["usage"]))
    events.append(b"data: [DONE]\n\n")
    return Response(
        b"".join(events),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", **headers},
    )
