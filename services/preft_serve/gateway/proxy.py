"""Forwarding a request to a worker: retries on connection failure, SSE relaying.

A request is retried on the next worker in its rendezvous order only when the connection
failed before any byte was sent (connect error / connect timeout): then the worker cannot
have started generating, so a retry cannot duplicate work. Any later failure is a 502. A
connection failure also counts against the worker's health, so a dead worker stops getting
traffic without waiting for the next health check.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from preft_serve.common.access_log import REQUEST_ID_HEADER
from preft_serve.common.error_envelope import error_body
from preft_serve.common.errors import ServiceError, ServiceUnavailable
from preft_serve.gateway.classic_slots import ClassicRequest
from preft_serve.gateway.routing import Choice, RouteResult, WorkerPool
from preft_serve.gateway.upstream import Calls, WorkerAnswer

logger = logging.getLogger(__name__)

RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout)


class BadGateway(ServiceError):
    http_status = 502
    code = "bad_gateway"


@dataclass
class Upstream:
    """An open worker response; ``aclose`` releases the worker's in-flight slot."""

    worker: str
    response: WorkerAnswer
    pool: WorkerPool
    result: RouteResult
    tenant: str | None = None  # whose open-request share it holds (None: none)
    classic: ClassicRequest | None = None  # the classic adapter it holds a slot of
    _closed: bool = False

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                await self.response.aclose()
            finally:
                self.pool.release(self.worker, self.classic)
                if self.tenant is not None:
                    self.pool.tenant_open.release(self.tenant)


async def open_upstream(
    calls: Calls,
    pool: WorkerPool,
    key: str,
    path: str,
    body: dict[str, Any],
    request_id: str | None = None,
    *,
    cold_tenant: str | None = None,
    prefill_hop: bool = False,
    tenant: str | None = None,
    classic: ClassicRequest | None = None,
) -> Upstream:
    """Send ``body`` to the best worker for ``key``; the response body is not read yet.
    ``request_id`` goes along as ``X-Request-Id`` (vLLM names the request after it).
    ``cold_tenant``: the tenant of an adapter request; where the chosen worker has not
    reported the adapter loaded, the request takes one of the tenant's cold-load slots
    (a 429 when none is free) until the worker answers: vLLM loads the adapter before it
    sends a stream's headers, so that is how long the load takes (a whole answer's
    headers come at its end: longer). ``prefill_hop``: a two-pool gateway's first hop
    (``WorkerPool.choose``). ``tenant``: whose open-request share the request holds until
    the upstream is closed (``tenant_budgets``; a 429 when the share is full).
    ``classic``: the request's (tenant, key) where its adapter keeps a worker's slot until
    the answer ends (``classic_slots``: workers where the tenant holds its most are left
    out, a 429 when that is all of them)."""
    route = take_route(pool, key, cold_tenant, prefill_hop, tenant, classic)
    try:
        upstream = await _open(calls, pool, route.choice, path, body, request_id)
    except BaseException:
        if tenant is not None:
            pool.tenant_open.release(tenant)
        raise
    finally:
        if route.cold_tenant is not None:
            pool.cold.release(route.cold_tenant)
    upstream.tenant = tenant
    return upstream


@dataclass(frozen=True)
class Route:
    """Where a request goes before any byte is sent: the workers to try, in order, and the
    tenant whose cold-load slot it holds (None: none; release it once the worker answers)."""

    choice: Choice
    cold_tenant: str | None


def take_route(
    pool: WorkerPool,
    key: str,
    cold_tenant: str | None = None,
    prefill_hop: bool = False,
    tenant: str | None = None,
    classic: ClassicRequest | None = None,
) -> Route:
    """The routing decision of one request, without I/O: one of ``tenant``'s open-request
    share (429 when it is full; the caller gives it back), the pool's choice for ``key``
    (503 ``gateway_busy`` at its open-request limit) and, when the first worker has not
    reported the adapter loaded, one of ``cold_tenant``'s cold-load slots (429 when none is
    free). A ``classic`` adapter's request goes only to workers where its tenant may hold
    one more (``WorkerPool.choose``). ``open_upstream`` and the scale simulator both
    decide through it."""
    if tenant is not None:
        pool.tenant_open.acquire(tenant)
    try:
        choice = pool.choose(key, prefill_hop, classic)
        cold = cold_tenant if cold_tenant is not None and choice.cold else None
        if cold is not None:
            pool.cold.acquire(cold)
    except BaseException:
        if tenant is not None:
            pool.tenant_open.release(tenant)
        raise
    return Route(choice, cold)


async def _open(
    calls: Calls,
    pool: WorkerPool,
    choice: Choice,
    path: str,
    body: dict[str, Any],
    request_id: str | None,
) -> Upstream:
    failures: list[str] = []
    # identity: the answer is relayed and parsed as bytes; aiohttp would otherwise offer
    # gzip/br, which the direct path does not decode (httpx's response did).
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    if request_id:
        headers[REQUEST_ID_HEADER] = request_id
    content = orjson.dumps(body)
    # A connect that timed out (rather than was refused) is retried once after every
    # worker was tried: when the gateway's own event loop stalls past connect_timeout_s
    # (a starved CPU), every connect in flight times out at once although the workers
    # accept, and a second try then connects. A refused connect is not retried.
    timed_out: list[str] = []
    for worker in choice.order:
        outcome = await _try(calls, pool, choice, worker, path, content, headers)
        if isinstance(outcome, Upstream):
            return outcome
        failures.append(f"{worker}: {outcome.__class__.__name__}")
        if isinstance(outcome, httpx.ConnectTimeout):
            timed_out.append(worker)
    for worker in timed_out:
        outcome = await _try(calls, pool, choice, worker, path, content, headers)
        if isinstance(outcome, Upstream):
            return outcome
        failures.append(f"{worker} (again): {outcome.__class__.__name__}")
    raise ServiceUnavailable("no worker is reachable (" + "; ".join(failures) + "); retry shortly")


async def _try(
    calls: Calls,
    pool: WorkerPool,
    choice: Choice,
    worker: str,
    path: str,
    content: bytes,
    headers: dict[str, str],
) -> Upstream | httpx.TransportError:
    """One worker's answer, or the connect failure to try the next one with (nothing was
    sent); any other failure is the request's (the worker may have it)."""
    pool.acquire(worker, choice.classic)
    try:
        response = await calls.post(worker, path, content, headers)
    except RETRYABLE as exc:
        pool.release(worker, choice.classic)
        pool.mark_failed(worker)
        logger.warning("worker %s unreachable (%s); trying the next one", worker, exc)
        return exc
    except httpx.HTTPError as exc:
        pool.release(worker, choice.classic)
        # The cause chain names what the client library saw (a timeout's kind, a reset).
        logger.warning("worker %s failed: %r (cause %r)", worker, exc, exc.__cause__)
        raise BadGateway(f"worker {worker} failed: {exc.__class__.__name__}") from None
    except BaseException:
        pool.release(worker, choice.classic)
        raise
    pool.mark_ok(worker)
    return Upstream(worker, response, pool, choice.landed(worker), classic=choice.classic)


TOOLS_OFF = (
    "tool calling is not enabled on this deployment: send the request without "
    "'tool_choice' (or with \"none\"), or ask its operator to enable tool calling"
)


def worker_error(payload: Any, status_code: int) -> dict[str, Any] | None:
    """A worker's error answer in the gateway's (OpenAI's) envelope, or None when
    ``payload`` is not one.

    vLLM writes ``{"error": {"message", "type": "BadRequestError", "param", "code": 400}}``
    (older versions the same fields at the top level): its ``type`` is a Python class name
    and its ``code`` the HTTP status, so clients that switch on OpenAI's strings see
    neither. The type follows the status, the code says what vLLM said in OpenAI's words.
    """
    if not isinstance(payload, dict):
        return None
    error = payload.get("error", payload)
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return None
    message: str = error["message"]
    if isinstance(error.get("code"), int) and 400 <= error["code"] < 600:
        status_code = error["code"]
    param = error.get("param") if isinstance(error.get("param"), str) else None
    if "--tool-call-parser" in message:  # names server flags a client cannot act on
        return error_body(status_code, TOOLS_OFF, code="tool_calling_disabled", param="tool_choice")
    if any(hint in message for hint in ("context length", "max_model_len")):
        code = "context_length_exceeded"
    elif status_code == 404:
        code = "not_found"
    elif status_code < 500:
        code = "invalid_value"
    else:
        code = "worker_error"
    return error_body(status_code, message, code=code, param=param)


async def read_whole(upstream: Upstream, what: str = "worker") -> bytes:
    """A worker's whole answer, its slot released; a 502 if the answer breaks off."""
    try:
        return await upstream.response.aread()
    except httpx.HTTPError as exc:
        raise BadGateway(
            f"{what} {upstream.worker} failed mid-response: {exc.__class__.__name__}"
        ) from None
    finally:
        await upstream.aclose()


class SseSplitter:
    """A worker's SSE bytes as whole events (without their blank-line separator), however
    the network cut them; ``rest`` is what follows the last separator so far."""

    def __init__(self) -> None:
        self.rest = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        self.rest += chunk
        if b"\n\n" not in self.rest:
            return []
        *events, self.rest = self.rest.split(b"\n\n")
        return events


def rewrite_json(payload: Any, public_name: str) -> Any:
    """Show the client the adapter's name, not the content address the worker saw, and
    none of the KV-transfer fields a prefill worker adds to its answers (null when it
    served the request whole): they are between the gateway and its workers."""
    if isinstance(payload, dict):
        if "model" in payload:
            payload["model"] = public_name
        payload.pop("kv_transfer_params", None)
    return payload


async def relay_sse(
    upstream: Upstream,
    worker_model: str,
    public_name: str,
    strip_usage: bool,
    on_usage: Callable[[Any], None],
    on_first_token: Callable[[], None],
    keep_chunk_usage: bool = True,
) -> AsyncIterator[bytes]:
    """Pass the worker's SSE stream through event by event, rewriting ``model``.

    The gateway always asks for ``stream_options.include_usage`` and
    ``continuous_usage_stats`` so it can count tokens, also of a stream that ends early
    (the client left, the worker broke): what was produced up to then is counted. Usage
    the client did not ask for is removed again (``strip_usage``: the final usage chunk;
    ``keep_chunk_usage`` False: the running totals on every chunk). ``on_first_token`` runs
    once, just before the first event carrying generated text is handed on.
    """
    rewriter = EventRewriter(worker_model, public_name, strip_usage, on_usage, keep_chunk_usage)
    splitter = SseSplitter()
    try:
        async for chunk in upstream.response.aiter_bytes():
            out = []
            for event in splitter.feed(chunk):
                rewritten, first_text = rewriter.rewrite(event)
                if first_text:
                    on_first_token()
                if rewritten is not None:
                    out.append(rewritten + b"\n\n")
            if out:
                yield b"".join(out)
        if splitter.rest.strip():
            yield splitter.rest
    except httpx.HTTPError as exc:
        # Headers are already sent: the best we can do is end the stream with an error event.
        logger.warning("stream from %s broke: %s", upstream.worker, exc)
        error = error_body(502, "the worker's stream broke", code="bad_gateway")
        yield b"data: " + json.dumps(error).encode() + b"\n\n"
    finally:
        # Before any await: a client that left cancels this task, and what the worker
        # produced for it until then is still counted (the last running totals).
        rewriter.finish()
        await upstream.aclose()


_USAGE_KEY = b',"usage":{'


def usage_span(event: bytes) -> tuple[Any, int, int] | None:
    """The ``usage`` object vLLM writes as a chunk's last field, and its byte span (comma
    included), found without parsing the chunk; None when it is absent or not flat."""
    start = event.rfind(_USAGE_KEY)
    if start < 0:
        return None
    end = event.find(b"}", start) + 1
    if end == 0 or event[end:] != b"}":  # nested, or not the last field: parse instead
        return None
    try:
        usage = orjson.loads(event[start + len(_USAGE_KEY) - 1 : end])
    except orjson.JSONDecodeError:
        return None
    return (usage, start, end) if isinstance(usage, dict) else None


def _has_text(payload: dict[str, Any]) -> bool:
    """Whether a chat (``delta.content``) or text (``text``) chunk carries generated text."""
    for choice in payload.get("choices") or []:
        if isinstance(choice, dict) and (
            choice.get("text") or (choice.get("delta") or {}).get("content")
        ):
            return True
    return False


class EventRewriter:
    """One stream's SSE events with ``model`` shown as the adapter's public name.

    Most events are rewritten as bytes: vLLM writes compact JSON, so the worker's
    ``"model":"sha256:<hex>"`` is found and swapped without parsing (an unescaped quote
    cannot occur inside a JSON string, so the match is the key itself). An event is parsed
    only while it matters: until the first one with generated text (time to first token),
    when it carries ``usage`` (dropped or stripped for clients that did not ask), or when
    the bytes do not look as expected.

    Usage is counted once, from the last event that carried it, by :meth:`finish`: with
    ``stream_options.continuous_usage_stats`` vLLM puts the running totals on every chunk
    (and the whole request's on its final usage chunk), so counting each one would count
    a stream's tokens once per chunk. A text chunk's totals are read from its tail and, for
    a client that did not ask for them, cut off as bytes (:func:`usage_span`).
    """

    def __init__(
        self,
        worker_model: str,
        public_name: str,
        strip_usage: bool,
        on_usage: Callable[[Any], None],
        keep_chunk_usage: bool = True,
    ) -> None:
        self._from = b'"model":' + json.dumps(worker_model).encode()
        self._to = b'"model":' + json.dumps(public_name).encode()
        self._public_name = public_name
        self._strip_usage = strip_usage
        self._keep_chunk_usage = keep_chunk_usage
        self._on_usage = on_usage
        self._seen_text = False
        self._usage: Any = None  # the last event's usage, counted by finish()

    def rewrite(self, event: bytes) -> tuple[bytes | None, bool]:
        """The event to send on (None: drop it), and whether it is the first with text."""
        if event == b"data: [DONE]":
            # Counted before the client can read the end: it may ask for the counts next.
            self.finish()
            return event, False
        if not event.startswith(b"data: "):
            return event, False
        if self._seen_text and self._from in event:
            if b'"usage"' not in event:
                return event.replace(self._from, self._to, 1), False
            span = usage_span(event) if b'"choices":[]' not in event else None
            if span is not None:
                self._usage, start, end = span
                if not self._keep_chunk_usage:
                    event = event[:start] + event[end:]
                return event.replace(self._from, self._to, 1), False
        return self._parsed(event)

    def finish(self) -> None:
        """The stream ended: count its usage (the last totals the worker sent), once."""
        usage, self._usage = self._usage, None
        if usage is not None:
            self._on_usage(usage)

    def _parsed(self, event: bytes) -> tuple[bytes | None, bool]:
        try:
            payload = orjson.loads(event[6:])
        except orjson.JSONDecodeError:
            return event, False
        if not isinstance(payload, dict):
            return event, False
        if "error" in payload and (error := worker_error(payload, 500)) is not None:
            return b"data: " + orjson.dumps(error), False
        usage = payload.get("usage")
        if usage:
            self._usage = usage
        if usage and not payload.get("choices"):  # the final usage chunk
            if self._strip_usage:
                return None, False
        elif not self._keep_chunk_usage:
            payload.pop("usage", None)
        rewrite_json(payload, self._public_name)
        first = not self._seen_text and _has_text(payload)
        self._seen_text = self._seen_text or first
        return b"data: " + orjson.dumps(payload), first
