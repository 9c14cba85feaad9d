"""Checks on a completion request body before anything is looked up or forwarded.

The body is kept as a plain dict (not a pydantic model of the whole OpenAI schema) so
fields the gateway does not know about reach the worker unchanged; only what the gateway
acts on is checked here.
"""

from __future__ import annotations

import json
from typing import Any

from preft_serve.common.errors import BadRequest

MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")
MAX_NAME_CHARS = 256  # user ids and model names end up in Redis keys


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object in ``raw``, or a 400 that says what is wrong with it."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def validate_body(body: dict[str, Any], *, chat: bool, max_tokens_cap: int) -> None:
    """Reject what the worker would reject late or what would exceed the operator's caps."""
    if chat:
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise BadRequest("'messages' must be a non-empty list of chat messages")
    elif "prompt" not in body:
        raise BadRequest("'prompt' is required")
    for field in MAX_TOKEN_FIELDS:
        value = body.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRequest(f"'{field}' must be a positive integer, got {value!r}")
        if value > max_tokens_cap:
            raise BadRequest(f"'{field}' is {value}, above this gateway's cap of "
                             f"{max_tokens_cap}; ask for at most {max_tokens_cap} tokens")
    for field in ("model", "user"):
        if body.get(field) is not None and not isinstance(body[field], str):
            raise BadRequest(f"'{field}' must be a string")
        if isinstance(body.get(field), str) and len(body[field]) > MAX_NAME_CHARS:
            raise BadRequest(f"'{field}' is {len(body[field])} characters long; at most "
                             f"{MAX_NAME_CHARS} are accepted")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("'stream' must be true or false")


def request_user(body: dict[str, Any], header: str | None) -> str | None:
    """The end user: the body's ``user`` field, else the ``X-User-Id`` header."""
    user = body.get("user") or header
    if user is not None and len(user) > MAX_NAME_CHARS:
        raise BadRequest(f"the user id is {len(user)} characters long; at most "
                         f"{MAX_NAME_CHARS} are accepted")
    return user
