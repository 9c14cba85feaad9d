"""A request's prompt tokens as a worker counts them (vLLM's ``POST /tokenize``).

Used only for streams that end before the worker reported any usage
(:mod:`gateway.stream_bill`): every adapter shares the base model's tokenizer, so the
worker tokenizes with the base model. Chat messages go through the chat template with
the request's own rendering options; a ``/v1/completions`` prompt of token ids is counted
here; a ``/v1/responses`` request is turned into the chat messages vLLM's Responses server
renders (instructions as the system message, the input items as messages).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

import orjson

from preft_serve.common.errors import ServiceError
from preft_serve.gateway.proxy import open_upstream, read_whole
from preft_serve.gateway.state import GatewayState

logger = logging.getLogger(__name__)

Kind = Literal["chat", "completion", "responses"]
# Chat request fields that change the rendered prompt, which /tokenize also takes.
CHAT_RENDERING = (
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
    "mm_processor_kwargs",
    "media_io_kwargs",
)


async def count_prompt(
    state: GatewayState,
    routing_key: str,
    body: dict[str, Any],
    kind: Kind,
    request_id: str | None = None,
) -> int | None:
    """The prompt tokens of a validated request ``body``; None when no worker counted
    them (unreachable, or it refused the tokenize request)."""
    try:
        if kind == "completion":
            return await _completion_prompt(state, routing_key, body, request_id)
        request = {"messages": body.get("messages")} if kind == "chat" else responses_chat(body)
        request.update({k: body[k] for k in CHAT_RENDERING if k in body})
        if kind == "responses":
            request.pop("tools", None)
            if tools := chat_tools(body.get("tools")):
                request["tools"] = tools
        return await _tokenize(state, routing_key, request, request_id)
    except (ServiceError, orjson.JSONDecodeError) as exc:
        logger.warning("prompt not counted: %s", exc)
        return None


async def _completion_prompt(
    state: GatewayState, routing_key: str, body: dict[str, Any], request_id: str | None
) -> int | None:
    prompt = body.get("prompt")
    prompts = prompt if isinstance(prompt, list) and not _is_ids(prompt) else [prompt]
    extra = (
        {"add_special_tokens": body["add_special_tokens"]} if "add_special_tokens" in body else {}
    )

    async def one(text: Any) -> int | None:
        if _is_ids(text):
            return len(text)
        return await _tokenize(state, routing_key, {"prompt": text, **extra}, request_id)

    counts = await asyncio.gather(*(one(p) for p in prompts))
    return None if any(c is None for c in counts) else sum(c or 0 for c in counts)


def _is_ids(prompt: Any) -> bool:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], int)


async def _tokenize(
    state: GatewayState, routing_key: str, request: dict[str, Any], request_id: str | None
) -> int | None:
    upstream = await open_upstream(
        state.calls,
        state.pool,
        routing_key,
        "/tokenize",
        {**request, "model": state.settings.worker_model},
        request_id,
    )
    raw = await read_whole(upstream, "tokenizing worker")
    if upstream.response.status_code != 200:
        logger.warning("worker %s refused to tokenize a prompt: %s", upstream.worker, raw[:300])
        return None
    count = orjson.loads(raw).get("count")
    return count if isinstance(count, int) else None


def responses_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A ``/v1/responses`` request's prompt as a ``/tokenize`` chat request."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    source = body.get("input")
    items = [{"role": "user", "content": source}] if isinstance(source, str) else source
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and (message := _message(item)) is not None:
            messages.append(message)
    return {"messages": messages}


def _message(item: dict[str, Any]) -> dict[str, Any] | None:
    """One input item as a chat message (as vLLM's Responses server makes it)."""
    kind = item.get("type", "message")
    if kind == "message":
        return {"role": item.get("role", "user"), "content": _text(item.get("content"))}
    if kind == "function_call":
        return {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                }
            ],
        }
    if kind == "function_call_output":
        return {
            "role": "tool",
            "content": _text(item.get("output")),
            "tool_call_id": item.get("call_id"),
        }
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    """The Responses API's function tools in chat's shape (others render nothing here)."""
    if not isinstance(tools, list):
        return []
    return [
        {
            "type": "function",
            "function": {k: tool[k] for k in ("name", "description", "parameters") if k in tool},
        }
        for tool in tools
        if isinstance(tool, dict) and tool.get("type") == "function"
    ]
