"""The served model's context length, as the workers report it, and how much of it a
request's output may take when the client sent no ``max_tokens``.

The gateway fills in ``max_tokens`` for requests that omit it (``validation``); a default
above the context (``PREFT_GATEWAY_MAX_TOKENS_CAP`` is 4096, a small deployment may serve
1024 tokens) makes vLLM refuse the request. Workers list ``max_model_len`` per model in
their ``/v1/models``, which the health poll reads anyway (``pool_monitor``); the smallest
one of the current workers bounds the default, since a request may land on any of them.

The gateway does not tokenize, so a text prompt's length in tokens is bounded from its
UTF-8 bytes: byte-level BPE and byte-fallback SentencePiece tokenizers never make more
tokens than bytes, and a chat template adds a few dozen tokens of its own.
"""

from __future__ import annotations

from typing import Any

import orjson

TEMPLATE_TOKENS = 64
"""Allowance for what a chat template (or BOS) adds around the client's text."""
UNKNOWN_SHARE = 4
"""When even the byte bound leaves no room, 1/4 of the context: text is about four bytes per
token for the tokenizers served here, so a prompt that really fits usually leaves that."""


class ContextWindow:
    """The workers' ``max_model_len``, per worker; :attr:`max_model_len` is the smallest."""

    def __init__(self) -> None:
        self._lengths: dict[str, int] = {}

    def report(self, worker: str, models: Any) -> None:
        """Read ``max_model_len`` off a worker's ``/v1/models`` answer (its smallest entry;
        the adapters it lists share the base model's context)."""
        data = models.get("data") if isinstance(models, dict) else None
        found = [
            m["max_model_len"]
            for m in data or ()
            if isinstance(m, dict)
            and isinstance(m.get("max_model_len"), int)
            and m["max_model_len"] > 0
        ]
        if found:
            self._lengths[worker] = min(found)

    def forget(self, worker: str) -> None:
        """Drop a worker discovery no longer lists (its context no longer bounds anything)."""
        self._lengths.pop(worker, None)

    @property
    def max_model_len(self) -> int | None:
        return min(self._lengths.values()) if self._lengths else None

    def room(self, prompt_tokens: int | None) -> int | None:
        """Output tokens that fit after a prompt of at most ``prompt_tokens`` (None: the
        context is not known yet)."""
        length = self.max_model_len
        if length is None:
            return None
        if prompt_tokens is not None and prompt_tokens < length:
            return length - prompt_tokens
        return max(1, length // UNKNOWN_SHARE)


def text_bound(value: Any) -> int:
    """At most how many tokens ``value`` (a string, or JSON such as chat messages)
    tokenizes into: its UTF-8 bytes (JSON syntax included, which only adds)."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.encode())
    return len(orjson.dumps(value))


def chat_prompt_bound(body: dict[str, Any]) -> int:
    """A chat request's prompt tokens at most: its messages and tools, and the template."""
    return text_bound(body.get("messages")) + text_bound(body.get("tools")) + TEMPLATE_TOKENS


def completion_prompt_bound(prompt: Any) -> int:
    """The longest of a (validated) ``/v1/completions`` prompt's prompts, in tokens at
    most: token-id prompts count exactly, text by :func:`text_bound` (plus BOS)."""
    if isinstance(prompt, str):
        return text_bound(prompt) + 1
    if prompt and isinstance(prompt[0], int):
        return len(prompt)
    return max(len(p) if isinstance(p, list) else text_bound(p) + 1 for p in prompt)


def responses_prompt_bound(body: dict[str, Any]) -> int:
    """A Responses request's prompt tokens at most: ``input``, ``instructions``, tools."""
    return (
        text_bound(body.get("input"))
        + text_bound(body.get("instructions"))
        + text_bound(body.get("tools"))
        + TEMPLATE_TOKENS
    )
