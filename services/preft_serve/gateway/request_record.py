"""One record per generating request (completions, chat, responses), counted once.

A request is counted in several places — ``requests_total`` by adapter and tenant, the error
cause, latency and time to first token, the tokens, for an adapter the outcome, output
tokens and time to first token by its serving policy's variant (metrics), the tenant's
usage (per version also its errors and time to first token) and the access log's fields —
and it can end in many ways: refused before a worker saw it, answered whole, streamed to
the end, streamed until the client left or the worker broke.
Handlers only note on the record what happened (:meth:`RequestRecord.answered`,
:meth:`~RequestRecord.fail`, :meth:`~RequestRecord.first_token`, the usage);
:meth:`RequestRecord.finish` counts it all, once. A handler's ``with record:`` finishes it
when the handler is done, unless the answer is a stream: then the stream's
:class:`~gateway.stream_bill.StreamBill` finishes it when it bills the stream (at its
final usage, so a client reading ``[DONE]`` may ask for its counts at once).
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

import redis
from starlette.requests import Request

from preft_serve.common.access_log import access_fields
from preft_serve.common.errors import ServiceError
from preft_serve.common.usage_breakdown import key_id_of
from preft_serve.gateway.metrics import GatewayMetrics, token_counts
from preft_serve.gateway.proxy import Upstream
from preft_serve.gateway.selection import Target
from preft_serve.gateway.state import GatewayState
from preft_serve.gateway.stream_bill import PromptCounter, StreamBill
from preft_serve.gateway.usage import UsageRecorder

NO_ADAPTER = "none"  # the adapter label of a request refused before one was selected


class RequestRecord:
    """What one request was and how it ended; counted by :meth:`finish`, once."""

    __slots__ = (
        "_metrics",
        "_usage",
        "adapter",
        "billed",
        "cause",
        "completion_tokens",
        "decode_worker",
        "finished",
        "first_token_at",
        "key_id",
        "log",
        "prompt_tokens",
        "route",
        "start",
        "status",
        "streaming",
        "target",
        "tenant",
        "tenant_label",
        "variant",
        "worker",
        "worker_answered",
    )

    def __init__(self, state: GatewayState, tenant: str, request: Request, route: str) -> None:
        self._metrics: GatewayMetrics = state.metrics
        self._usage: UsageRecorder = state.usage
        self.log = access_fields(request)  # the access log's fields (charge adds the user)
        self.start = time.perf_counter()
        self.tenant, self.route = tenant, route
        # The key's id (public, part of the key itself) for the per-key usage.
        self.key_id = key_id_of(request.headers.get("authorization"))
        self.tenant_label = self._metrics.tenant_label(tenant)
        self.adapter = NO_ADAPTER  # the adapter's metric label, once selected
        self.target: Target | None = None
        self.variant: str | None = None  # the serving policy's part that chose the version
        self.worker: str | None = None
        self.decode_worker: str | None = None
        self.status: int | None = None  # None: ended before any answer (client left)
        self.cause: str | None = None  # errors_total's cause, when it failed
        self.worker_answered = False  # a worker's answer reached the client (latency)
        self.first_token_at: float | None = None
        self.billed = False  # its usage is billed (a worker served it)
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.streaming = False  # finished by its stream's bill, not by the handler
        self.finished = False

    def __enter__(self) -> RequestRecord:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """The handler is done: count how it failed, if it did; finish unless a stream
        goes on (its bill finishes it)."""
        if isinstance(exc, ServiceError):
            self.fail(exc.status_code, exc.code)
        elif isinstance(exc, redis.RedisError):
            self.fail(503, None)  # the app's handler counts the cause as it answers
        if exc is not None or not self.streaming:
            self.finish()

    def selected(self, target: Target, variant: str | None = None) -> None:
        """The adapter (or base model) that serves the request, and for an adapter the
        part of its serving policy that chose the version (``common.version_split``), by
        which the request's outcome is counted too."""
        self.target, self.variant = target, variant
        self.adapter = self._metrics.adapter_label(target.public_name)

    def answered(self, upstream: Upstream) -> int:
        """A worker answered (a whole request, or its prefill hop): where it was routed
        and its status; that status."""
        self._metrics.routing_of(upstream.result.value).inc()
        self.worker = upstream.worker
        return self._worker_status(upstream.response.status_code)

    def decoded(self, upstream: Upstream) -> int:
        """The decode hop's worker answered; its status."""
        self.decode_worker = upstream.worker
        return self._worker_status(upstream.response.status_code)

    def _worker_status(self, status: int) -> int:
        self.status, self.worker_answered = status, True
        self.cause = f"worker_{status // 100}xx" if status >= 400 else None
        return status

    def fail(self, status: int, cause: str | None) -> None:
        """The gateway answers with an error (``cause`` None: counted where answered)."""
        self.status, self.cause, self.worker_answered = status, cause, False

    def first_token(self) -> None:
        """The first generated text is sent to the client (streams)."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()

    def bill(self, usage: Any) -> None:
        """Bill the worker's ``usage`` (an OpenAI usage object; malformed counts: none)."""
        self.billed = True
        self.prompt_tokens, self.completion_tokens = token_counts(usage)

    def stream_bill(self, prompt_tokens: PromptCounter) -> StreamBill:
        """The bill of the stream that now answers: it bills and finishes this record once,
        however the stream ends."""
        self.streaming = True
        return StreamBill(self._end_stream, prompt_tokens)

    def _end_stream(self, usage: Any) -> None:
        self.bill(usage)
        self.finish()

    def finish(self) -> None:
        """Count the request: metrics, per-day usage, the access log's fields. Once."""
        if self.finished:
            return
        self.finished = True
        self._log_fields()
        if self.status is None:
            return
        metrics, adapter, now = self._metrics, self.adapter, time.perf_counter()
        metrics.record_request(self.tenant_label, adapter, self.status)
        if self.cause is not None:
            metrics.errors_of(self.cause).inc()
        if self.worker_answered:
            metrics.latency_of(adapter).observe(now - self.start)
        ttft = None if self.first_token_at is None else self.first_token_at - self.start
        if ttft is not None:
            metrics.ttft_of(adapter).observe(ttft)
        if self.variant is not None:
            completion = self.completion_tokens if self.billed else None
            metrics.record_variant(adapter, self.variant, self.status, completion, ttft)
        target = self.target
        if target is not None and (self.billed or self.status >= 400):
            prompt, completion = self.prompt_tokens, self.completion_tokens
            if self.billed:
                metrics.record_tokens(adapter, prompt, completion, self.tenant_label)
            served = target.adapter
            self._usage.record(
                self.tenant,
                target.public_name,
                requests=1 if self.billed else 0,
                prompt_tokens=prompt or 0,
                completion_tokens=completion or 0,
                user=self.log.get("user"),
                key_id=self.key_id,
                version=None if served is None else f"{served.name}@{served.version}",
                errors=1 if self.status >= 400 else 0,
                ttft_s=ttft,
            )

    def _log_fields(self) -> None:
        log = self.log
        if self.target is not None:
            log.update(self.target.log_fields())
        if self.worker is not None:
            log["worker"] = self.worker
        if self.decode_worker is not None:
            log["decode_worker"] = self.decode_worker
        if self.prompt_tokens is not None:
            log["prompt_tokens"] = self.prompt_tokens
        if self.completion_tokens is not None:
            log["completion_tokens"] = self.completion_tokens
