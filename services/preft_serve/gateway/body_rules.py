"""What the gateway accepts in the generating routes' bodies, field by field: the one table
that ``gateway.validation`` checks bodies with and ``gateway.openapi`` documents them from.

The body stays a plain dict (fields the gateway does not act on reach vLLM unchanged), so
only fields the gateway itself checks are here. A rule's ``schema`` is the JSON schema of
the values it accepts; limits that are the deployment's settings (``cap``: a
:class:`~gateway.validation.Caps` field) are described by what they bound, never by the
setting's name (the document is served to tenants; a refusal states the value).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_NAME_CHARS = 256  # user ids and model names end up in Redis keys


@dataclass(frozen=True)
class Rule:
    """One body field the gateway checks (a 400 otherwise)."""

    schema: Mapping[str, Any]
    doc: str = ""  # what the document says beyond the schema
    cap: str | None = None  # the Caps field a count is bounded by
    over: str = ""  # the refusal past the cap, after "above this gateway's ", with {cap}

    def openapi(self) -> dict[str, Any]:
        """The field's schema in the OpenAPI document."""
        return {**self.schema, "description": self.doc} if self.doc else dict(self.schema)


NAME = {"type": ["string", "null"], "maxLength": MAX_NAME_CHARS}
POSITIVE = {"type": ["integer", "null"], "minimum": 1}
TOKEN_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
TOKENS_OVER = "cap of {cap}; ask for at most {cap} tokens"

# The names that pick an adapter and its user (every route that forwards to a worker).
NAMES: dict[str, Rule] = {
    "model": Rule(
        NAME, "One of your adapters, or the base model's name; omitted: the adapter bound to `user`"
    ),
    "user": Rule(NAME, "End user whose adapter binding applies (or the X-User-Id header)"),
    "safety_identifier": Rule(NAME, "The end user, as `user` (both at once must agree)"),
}
ADAPTER_ID = Rule(
    {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS},
    "LoRAX's way to name one of your adapters, as `model` does",
)
STREAM = Rule({"type": "boolean"})
MAX_TOKENS = Rule(
    POSITIVE,
    "At most this gateway's cap on max_tokens; omitted: filled in by the gateway",
    cap="max_tokens",
    over=TOKENS_OVER,
)
CHOICES = Rule(
    POSITIVE,
    "Choices; at most this gateway's cap on choices",
    cap="max_choices",
    over="limit of {cap} choices per request; ask for at most {cap}",
)

# Chat and text completions: the output-token fields, then the choice fields.
TOKEN_FIELDS: dict[str, Rule] = {
    "max_tokens": MAX_TOKENS,
    "max_completion_tokens": Rule(POSITIVE, cap="max_tokens", over=TOKENS_OVER),
}
CHOICE_FIELDS: dict[str, Rule] = {
    "n": CHOICES,
    "best_of": Rule(POSITIVE, cap="max_choices", over=CHOICES.over),
}
_GENERATING = {**NAMES, "adapter_id": ADAPTER_ID, "stream": STREAM}
_COMPLETING = {**_GENERATING, **TOKEN_FIELDS, **CHOICE_FIELDS}

CHAT: dict[str, Rule] = {
    "messages": Rule({"type": "array", "minItems": 1}, "The chat so far"),
    **_COMPLETING,
}
COMPLETION: dict[str, Rule] = {
    "prompt": Rule(
        {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "minItems": 1, "items": {"type": "string"}},
                TOKEN_IDS,
                {"type": "array", "minItems": 1, "items": TOKEN_IDS},
            ]
        },
        "At most this gateway's cap on prompts per request, each at most its cap on token ids",
    ),
    **_COMPLETING,
}
RESPONSES_MAX_TOKENS = "max_output_tokens"
RESPONSES: dict[str, Rule] = {
    "input": Rule(
        {"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1}]},
        "The whole conversation (responses are not stored: previous_response_id, "
        "conversation and background are refused)",
    ),
    RESPONSES_MAX_TOKENS: Rule(
        POSITIVE,
        "At most this gateway's cap on max_tokens; omitted: "
        "what fits the model's context after the input, up to that cap",
        cap="max_tokens",
        over=TOKENS_OVER,
    ),
    "tools": Rule(
        {"type": "array"},
        "Passed to the worker when the deployment runs a "
        "tool-call parser; otherwise a 400 tool_calling_disabled (never silently "
        "ignored), as is tool_choice",
    ),
    **_GENERATING,
}
