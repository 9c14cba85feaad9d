"""Adapter-free decode: one request served by two workers (docs/disaggregation.md).

A prefill-only (PreFT) adapter touches prompt positions only, so its request can be split:

1. **prefill hop**, to the adapter's worker (routed by adapter affinity as always): the
   request with ``max_tokens: 1`` and NIXL's ``do_remote_decode``. That worker computes
   every prompt position with the adapter, samples the first token from the last one, and
   keeps the prompt's KV blocks for a decode worker to read (``--kv-lease-s``);
2. **decode hop**, to the least-loaded decode worker (the base model, no adapters): a
   ``/v1/completions`` request for *prompt + first token* carrying the prefill's
   ``kv_transfer_params``. It reads positions ``0..P-1`` over NIXL and computes ``P`` onward
   with the base weights: the tokens one worker would have produced.

The client sees one ordinary answer or stream: the first token from the prefill hop, the
rest from the decode hop, ``usage`` counted once (the first token is output, not prompt).
Requests whose options span both hops (several choices, logprobs, tools and structured
output, penalties on output tokens...) and all-token adapters are served whole by one
worker, as without a decode pool; so is a request when no decode worker can be reached.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from preft_serve.adapters.format import AdapterMode
from preft_serve.common.error_envelope import error_body
from preft_serve.common.errors import ServiceUnavailable
from preft_serve.gateway.proxy import (
    SseSplitter,
    Upstream,
    open_upstream,
    read_whole,
    worker_error,
)
from preft_serve.gateway.selection import Target
from preft_serve.gateway.state import GatewayState

DECODE_PATH = "/v1/completions"
# What a prefill worker needs to keep the prompt's KV for a decode worker (vLLM's NIXL
# connector fills in the rest of its answer's kv_transfer_params).
REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
# Sampling fields that mean the same on the decode hop, carried over as they are.
CARRIED = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "repetition_penalty",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
)
# Fields either hop can take as the client sent them (everything else: served whole).
_COMMON = {
    "model",
    "max_tokens",
    "stream",
    "stream_options",
    "user",
    "safety_identifier",
    "return_token_ids",
    "cache_salt",
    "priority",
    *CARRIED,
}
_CHAT = _COMMON | {
    "messages",
    "max_completion_tokens",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
}
_TEXT = _COMMON | {"prompt"}
# Fields accepted at their no-op value ("n": 1, "logprobs": false ...).
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "logprobs": (False, None),
    "top_logprobs": (0, None),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "echo": (False,),
    "min_tokens": (0,),
    "tools": ([],),
    "parallel_tool_calls": (True, False),
}


def unified_reason(body: dict[str, Any], chat: bool, target: Target) -> str | None:
    """Why this request must run whole on one worker (a metric label), or None."""
    if target.adapter is not None and target.adapter.mode is not AdapterMode.PREFILL:
        return "all_token_adapter"
    if _max_tokens(body, chat) <= 1:
        return "one_token"
    allowed = _CHAT if chat else _TEXT
    for field, value in body.items():
        if field not in allowed and value not in _NEUTRAL.get(field, ()):
            return "option"
    if not chat and not _single_prompt(body.get("prompt")):
        return "option"
    return None


def _max_tokens(body: dict[str, Any], chat: bool) -> int:
    # validate_body filled these in; chat workers read max_completion_tokens first.
    value = (body.get("max_completion_tokens") if chat else None) or body.get("max_tokens")
    return value if isinstance(value, int) else 1


def _single_prompt(prompt: Any) -> bool:
    return isinstance(prompt, str) or (
        isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], int)
    )


@dataclass
class FirstToken:
    """The prefill hop's answer: the first token and what the decode hop needs."""

    payload: dict[str, Any]  # the worker's JSON answer
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    kv_params: dict[str, Any] | None

    @classmethod
    def parse(cls, payload: dict[str, Any], chat: bool) -> FirstToken:
        choice = payload["choices"][0]
        text = (choice.get("message") or {}).get("content") if chat else choice.get("text")
        # Chat answers carry the prompt's ids at the top, text completions per choice.
        prompt_ids = payload.get("prompt_token_ids") or choice.get("prompt_token_ids")
        return cls(
            payload,
            list(prompt_ids or []),
            list(choice.get("token_ids") or []),
            text or "",
            choice.get("finish_reason"),
            payload.get("kv_transfer_params"),
        )

    @property
    def handed_off(self) -> bool:
        """Whether the prefill worker kept the prompt's KV for a decode worker (a worker
        not started with ``--role prefill`` answers without ``kv_transfer_params``)."""
        return bool(self.kv_params and self.prompt_ids and self.token_ids)

    @property
    def complete(self) -> bool:
        """The answer ended at its first token (end of sequence, a stop string)."""
        return self.finish_reason not in (None, "length")


def prefill_body(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    hop = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    hop["max_tokens"] = 1
    if chat:
        hop["max_completion_tokens"] = 1
    hop["return_token_ids"] = True
    hop["kv_transfer_params"] = dict(REMOTE_DECODE)
    return hop


def decode_body(
    body: dict[str, Any], chat: bool, first: FirstToken, worker_model: str
) -> dict[str, Any]:
    hop: dict[str, Any] = {k: body[k] for k in CARRIED if k in body}
    hop.update(
        model=worker_model,
        prompt=first.prompt_ids + first.token_ids,
        max_tokens=_max_tokens(body, chat) - len(first.token_ids),
        kv_transfer_params=first.kv_params,
        return_token_ids=True,
        stream=bool(body.get("stream")),
    )
    if hop["stream"]:
        hop["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return hop


def client_usage(first: FirstToken, decode_usage: Any) -> dict[str, Any] | None:
    """The request's usage: the prompt once (as the prefill worker counted it, cached
    tokens included), the first token counted as output."""
    if not isinstance(decode_usage, dict):
        return None
    prefill_usage = first.payload.get("usage") or {}
    prompt = len(first.prompt_ids) or int(prefill_usage.get("prompt_tokens") or 0)
    completion = len(first.token_ids) + int(decode_usage.get("completion_tokens") or 0)
    return {
        **decode_usage,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": prefill_usage.get("prompt_tokens_details"),
    }


def ends_in_stop_start(text: str, stop: str) -> bool:
    """Whether ``text`` ends with a non-empty proper prefix of ``stop`` (one the rest of
    the output could complete). Only ``text``'s last ``len(stop) - 1`` characters can take
    part: at most that many suffixes are compared, each of at most that many characters, so
    the work is bounded by the stop string's length (at most ``body_rules.MAX_STOP_CHARS``),
    whatever the text's."""
    most = min(len(text), len(stop) - 1)
    return any(stop.startswith(text[-j:]) for j in range(1, most + 1))


class Handoff:
    """One request across the two pools; :meth:`first_token` then :meth:`decode`."""

    def __init__(
        self,
        state: GatewayState,
        target: Target,
        body: dict[str, Any],
        chat: bool,
        path: str,
        request_id: str | None,
        tenant: str | None = None,
    ) -> None:
        self.state, self.target, self.body = state, target, body
        self.chat, self.path, self.request_id = chat, path, request_id
        self.tenant = tenant  # whose open-request share each hop holds
        self.stream = bool(body.get("stream"))
        self.want_ids = bool(body.get("return_token_ids"))
        options = body.get("stream_options")
        options = options if isinstance(options, dict) else {}
        # The client's own choices (the decode hop always asks for usage, to count it):
        # a final usage event, and running totals on every chunk (as vLLM, only with both).
        self.include_usage = bool(options.get("include_usage"))
        self.chunk_usage = self.include_usage and bool(options.get("continuous_usage_stats"))

    def stop_may_span(self, first: FirstToken) -> bool:
        """Whether a stop string could begin in the first token's text and end in the decode
        hop's (:func:`ends_in_stop_start`): the decode worker matches stop strings in its own
        output only (the first token is its prompt), so such a request is served whole
        instead."""
        stops = self.body.get("stop")
        stops = [stops] if isinstance(stops, str) else stops
        return isinstance(stops, list) and any(
            isinstance(stop, str) and ends_in_stop_start(first.text, stop) for stop in stops
        )

    async def prefill(self) -> tuple[Upstream, bytes]:
        """The prefill hop, on the adapter's worker: its answer, read whole (closed). It
        loads the adapter, so it takes the tenant's cold-load budget as a whole request
        does (``proxy.open_upstream``)."""
        upstream = await open_upstream(
            self.state.calls,
            self.state.pool,
            self.target.routing_key,
            self.path,
            prefill_body(self.body, self.chat),
            self.request_id,
            cold_tenant=self.target.cold_tenant,
            prefill_hop=True,
            tenant=self.tenant,
        )
        return upstream, await read_whole(upstream)

    async def open_decode(self, first: FirstToken) -> Upstream:
        """The decode hop's worker, by load alone (any decode worker serves any user)."""
        pool = self.state.decode_pool
        if pool is None:
            raise ServiceUnavailable("no decode pool")
        key = self.request_id or f"{time.monotonic_ns()}"
        return await open_upstream(
            self.state.calls,
            pool,
            key,
            DECODE_PATH,
            decode_body(self.body, self.chat, first, self.state.settings.worker_model),
            self.request_id,
            tenant=self.tenant,
        )

    def answer(self, first: FirstToken, decoded: dict[str, Any] | None) -> dict[str, Any]:
        """The whole answer as one worker would have written it."""
        out = dict(first.payload)
        out.pop("kv_transfer_params", None)
        out["model"] = self.target.public_name
        choice = dict(out["choices"][0])
        ids = first.token_ids
        if decoded is not None:
            rest = decoded["choices"][0]
            text = first.text + (rest.get("text") or "")
            if self.chat:
                choice["message"] = {**(choice.get("message") or {}), "content": text}
            else:
                choice["text"] = text
            choice["finish_reason"] = rest.get("finish_reason")
            choice["stop_reason"] = rest.get("stop_reason")
            ids = ids + list(rest.get("token_ids") or [])
            out["usage"] = client_usage(first, decoded.get("usage"))
        if self.want_ids:
            choice["token_ids"] = ids
        else:
            for key in ("token_ids", "prompt_token_ids"):
                choice.pop(key, None)
                out.pop(key, None)
        out["choices"] = [choice]
        return out

    def first_events(self, first: FirstToken) -> list[bytes]:
        """The stream's opening events: what a worker streams up to its first token (with
        its finish reason when the answer ends there)."""
        finish = first.finish_reason if first.complete else None
        base = self._chunk_fields(first)
        usage = self._first_usage(first) if self.chunk_usage else None
        text = self._chunk(
            base,
            {"content": first.text} if self.chat else first.text,
            finish,
            first.token_ids,
            usage,
        )
        if self.chat:
            opening = (
                {**usage, "completion_tokens": 0, "total_tokens": usage["prompt_tokens"]}
                if usage
                else None
            )
            return [
                self._chunk(base, {"role": "assistant", "content": ""}, None, usage=opening),
                text,
            ]
        return [text]

    @staticmethod
    def _first_usage(first: FirstToken) -> dict[str, Any]:
        """The running totals up to the first token, as the chunk that carries it shows."""
        prompt = len(first.prompt_ids)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": len(first.token_ids),
            "total_tokens": prompt + len(first.token_ids),
        }

    def _chunk_fields(self, first: FirstToken) -> dict[str, Any]:
        """What every event of the stream says: the prefill answer's id and time."""
        return {
            "id": first.payload.get("id"),
            "created": first.payload.get("created"),
            "model": self.target.public_name,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
        }

    def _chunk(
        self,
        base: dict[str, Any],
        content: Any,
        finish: str | None,
        ids: list[int] | None = None,
        usage: dict[str, Any] | None = None,
    ) -> bytes:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if self.chat:
            choice["delta"] = content
        else:
            choice["text"] = content
        if ids is not None and self.want_ids:
            choice["token_ids"] = ids
        event = {**base, "choices": [choice]}
        if usage is not None:
            event["usage"] = usage
        return b"data: " + orjson.dumps(event) + b"\n\n"

    def usage_event(self, first: FirstToken, usage: dict[str, Any]) -> bytes:
        payload = {**self._chunk_fields(first), "choices": [], "usage": usage}
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    async def relay_decode(
        self, first: FirstToken, upstream: Upstream, on_usage: Callable[[Any], None]
    ) -> AsyncIterator[bytes]:
        """The decode worker's stream as the rest of the client's stream."""
        base = self._chunk_fields(first)
        usage: dict[str, Any] | None = None
        splitter = SseSplitter()
        try:
            async for piece in upstream.response.aiter_bytes():
                out = []
                for event in splitter.feed(piece):
                    if not event.startswith(b"data: ") or event == b"data: [DONE]":
                        continue
                    payload = orjson.loads(event[6:])
                    if "error" in payload:
                        error = worker_error(payload, 500) or payload
                        out.append(b"data: " + orjson.dumps(error) + b"\n\n")
                        continue
                    usage = client_usage(first, payload.get("usage")) or usage
                    for choice in payload.get("choices") or []:
                        content: Any = choice.get("text") or ""
                        if self.chat:
                            content = {"content": content}
                        out.append(
                            self._chunk(
                                base,
                                content,
                                choice.get("finish_reason"),
                                choice.get("token_ids"),
                                usage if self.chunk_usage else None,
                            )
                        )
                if out:
                    yield b"".join(out)
        except (httpx.HTTPError, orjson.JSONDecodeError) as exc:
            # Headers are sent: end the stream with an error event.
            self.state.metrics.errors.labels("bad_gateway").inc()
            error = error_body(
                502,
                f"the decode worker's stream broke: {exc.__class__.__name__}",
                code="bad_gateway",
            )
            yield b"data: " + orjson.dumps(error) + b"\n\n"
        finally:
            if usage is not None:
                on_usage(usage)
            await upstream.aclose()
        if usage is not None and self.include_usage:
            yield self.usage_event(first, usage)
        yield b"data: [DONE]\n\n"
