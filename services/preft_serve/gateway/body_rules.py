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

# Lists vLLM applies on every generated token or decoding step: each stop string is
# searched for in the output (and the gateway looks for one across its two hops), each stop
# token id is compared with every new token, bad words and logit biases are applied to every
# step's logits, a choice list becomes the grammar that masks every step. Fixed bounds, not
# settings: what one request costs per token stays small whatever the body limit allows.
MAX_STOP_SEQUENCES = 4  # OpenAI's limit, and vLLM's default (VLLM_MAX_STOP_STRINGS)
MAX_STOP_CHARS = 256  # each stop string, and each bad word
MAX_STOP_TOKEN_IDS = 64
# vLLM refuses more than 128 bad words once tokenized (VLLM_MAX_NUM_BAD_WORDS), and a
# word can count twice there (with and without a leading space).
MAX_BAD_WORDS = 64
MAX_LOGIT_BIAS = 300  # OpenAI's limit
# vLLM turns allowed_token_ids into a vocabulary-wide mask once per request (its V1 model
# runner, the one the workers run), so the list's length costs at admission, not per token;
# 1024 is vLLM's own limit in its V2 runner (MAX_NUM_ALLOWED_TOKEN_IDS), so a request
# accepted here runs on either, and a larger set is better said by what it excludes.
MAX_ALLOWED_TOKEN_IDS = 1024
MAX_GUIDED_CHOICES = 256  # structured_outputs.choice: the alternatives the output is one of
MAX_GUIDED_CHOICE_CHARS = 256


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


def _texts(most: int, chars: int) -> dict[str, Any]:
    return {"type": "array", "maxItems": most, "items": {"type": "string", "maxLength": chars}}


def _ids(most: int) -> dict[str, Any]:
    return {"type": ["array", "null"], "maxItems": most, "items": {"type": "integer", "minimum": 0}}


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
# The per-token lists: bounded here, each element's meaning is the worker's to judge.
STOP_AND_BIAS: dict[str, Rule] = {
    "stop": Rule(
        {
            "anyOf": [
                {"type": "string", "maxLength": MAX_STOP_CHARS},
                _texts(MAX_STOP_SEQUENCES, MAX_STOP_CHARS),
                {"type": "null"},
            ]
        },
        f"Up to {MAX_STOP_SEQUENCES} stop sequences of at most {MAX_STOP_CHARS} characters",
    ),
    "stop_token_ids": Rule(_ids(MAX_STOP_TOKEN_IDS), "Token ids that end the output"),
    "logit_bias": Rule(
        {"type": ["object", "null"], "maxProperties": MAX_LOGIT_BIAS},
        "Token id (as a string) to a bias added to its logit",
    ),
    "structured_outputs": Rule(
        {
            "type": ["object", "null"],
            "properties": {
                "choice": {
                    **_texts(MAX_GUIDED_CHOICES, MAX_GUIDED_CHOICE_CHARS),
                    "type": ["array", "null"],
                }
            },
        },
        "vLLM's constraints on the output; `choice`: the answers it may be, "
        f"at most {MAX_GUIDED_CHOICES} of at most {MAX_GUIDED_CHOICE_CHARS} characters "
        "(a larger set: `regex` or `json`)",
    ),
}
SAMPLING_LISTS: dict[str, Rule] = {
    **STOP_AND_BIAS,
    "bad_words": Rule(_texts(MAX_BAD_WORDS, MAX_STOP_CHARS), "Words the output must not contain"),
    "allowed_token_ids": Rule(
        _ids(MAX_ALLOWED_TOKEN_IDS), "The only token ids the output may contain"
    ),
}
BEAM_SEARCH = Rule(
    {"type": ["boolean", "null"], "enum": [False, None]},
    "Not served (400 unsupported_parameter): vLLM's beam search re-sends the beams' tokens "
    "as prompt, where a prefill-only adapter would apply to them; use `n`",
)
_GENERATING = {**NAMES, "adapter_id": ADAPTER_ID, "stream": STREAM, "use_beam_search": BEAM_SEARCH}
_COMPLETING = {**_GENERATING, **TOKEN_FIELDS, **CHOICE_FIELDS, **SAMPLING_LISTS}

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
    **STOP_AND_BIAS,  # vLLM's Responses server reads these, not bad_words nor allowed_token_ids
}
