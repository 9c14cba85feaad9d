"""Checks on a completion request body before anything is looked up or forwarded.

The body is kept as a plain dict (not a pydantic model of the whole OpenAI schema) so
fields the gateway does not know about reach the worker unchanged; only what the gateway
acts on is checked here. Besides shape, the checks bound what one request may cost: the
output tokens it may ask for (``prompts x max(n, best_of) x max_tokens``, with a default
``max_tokens`` filled in when the client sent none, small enough to fit the served model's
context: ``context_window``), the size of its prompt lists, and the lists vLLM applies on
every generated token (``stop``, ``logit_bias`` ...: fixed bounds). The fields checked, with
their shapes and caps, are one table (``body_rules``) that the OpenAPI document shows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import orjson

from preft_serve.common.adapter_boundary import ADAPTER_TOKENS_XARG
from preft_serve.common.errors import BadRequest
from preft_serve.common.jsondepth import json_nests_deeper
from preft_serve.common.tenant_xarg import TENANT_XARG
from preft_serve.gateway import body_rules
from preft_serve.gateway.body_rules import (
    MAX_ALLOWED_TOKEN_IDS,
    MAX_BAD_WORDS,
    MAX_GUIDED_CHOICE_CHARS,
    MAX_GUIDED_CHOICES,
    MAX_LOGIT_BIAS,
    MAX_NAME_CHARS,
    MAX_STOP_CHARS,
    MAX_STOP_SEQUENCES,
    MAX_STOP_TOKEN_IDS,
    RESPONSES_MAX_TOKENS,
    Rule,
)
from preft_serve.gateway.context_window import (
    ContextWindow,
    chat_prompt_bound,
    completion_prompt_bound,
    responses_prompt_bound,
)

# The fields and bounds are those of the one table the OpenAPI document shows (body_rules).
MAX_TOKEN_FIELDS = tuple(body_rules.TOKEN_FIELDS)
CHOICE_FIELDS = tuple(body_rules.CHOICE_FIELDS)
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for /v1/completions
PROMPT_SHAPES = (
    "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists"
)


@dataclass(frozen=True)
class Caps:
    """The operator's bounds on one request (``PREFT_GATEWAY_MAX_*`` settings)."""

    max_tokens: int
    max_request_tokens: int
    max_choices: int
    max_prompts: int
    max_prompt_token_ids: int
    max_json_depth: int
    # The workers' context length (updated by the health poll); None: not bounded by it.
    context: ContextWindow | None = None

    def fitting(self, default: int, prompt_tokens: int) -> int:
        """``default``, lowered to what fits the context after ``prompt_tokens`` at most."""
        room = self.context.room(prompt_tokens) if self.context is not None else None
        return default if room is None else min(default, room)


def check_depth(raw: bytes, limit: int) -> None:
    """400 if arrays/objects nest deeper than ``limit``, before the (recursive) JSON parser
    sees the body. Brackets inside strings do not count."""
    if json_nests_deeper(raw, limit):
        raise BadRequest(
            f"request body nests JSON arrays/objects deeper than {limit} levels; "
            "flatten the request",
            code="invalid_json",
        )


def parse_body(raw: bytes, max_depth: int = 64) -> dict[str, Any]:
    """The JSON object in ``raw``, or a 400 that says what is wrong with it."""
    check_depth(raw, max_depth)
    try:
        body = orjson.loads(raw)  # rejects NaN/Infinity and integers past 64 bits too
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    return body


def _positive_int(body: dict[str, Any], field: str, rule: Rule, cap: int) -> int | None:
    """``body[field]`` (None when absent) if it is a positive integer of at most ``cap``, the
    value of the rule's ``Caps`` field (or a lower bound of the route's)."""
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(f"'{field}' must be a positive integer, got {value!r}", param=field)
    if value > cap:
        raise BadRequest(
            f"'{field}' is {value}, above this gateway's " + rule.over.format(cap=cap), param=field
        )
    return value


def _capped(body: dict[str, Any], rules: dict[str, Rule], caps: Caps) -> list[int | None]:
    """The positive-integer fields of ``rules`` in ``body``, each within its cap."""
    return [
        _positive_int(body, field, rule, getattr(caps, rule.cap or ""))
        for field, rule in rules.items()
    ]


def _token_ids(ids: list[Any], caps: Caps, where: str) -> None:
    if len(ids) > caps.max_prompt_token_ids:
        raise BadRequest(
            f"{where} has {len(ids)} token ids; at most {caps.max_prompt_token_ids} are accepted",
            param="prompt",
        )
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise BadRequest(
            f"{PROMPT_SHAPES}; token ids must be non-negative integers", param="prompt"
        )


def count_prompts(prompt: Any, caps: Caps) -> int:
    """How many prompts a ``/v1/completions`` ``prompt`` holds (checked against the caps)."""
    if isinstance(prompt, str):
        return 1
    if not isinstance(prompt, list):
        raise BadRequest(PROMPT_SHAPES, param="prompt")
    if not prompt:
        raise BadRequest("'prompt' must not be empty", param="prompt")
    if isinstance(prompt[0], int) and not isinstance(prompt[0], bool):
        _token_ids(prompt, caps, "'prompt'")
        return 1
    if len(prompt) > caps.max_prompts:
        raise BadRequest(
            f"'prompt' holds {len(prompt)} prompts; at most {caps.max_prompts} "
            "are accepted per request: send the rest in further requests",
            param="prompt",
        )
    if all(isinstance(p, str) for p in prompt):
        return len(prompt)
    if not all(isinstance(p, list) and p for p in prompt):
        raise BadRequest(PROMPT_SHAPES, param="prompt")
    for index, ids in enumerate(prompt):
        _token_ids(ids, caps, f"prompt {index}")
    return len(prompt)


def validate_body(body: dict[str, Any], *, chat: bool, caps: Caps) -> int:
    """Reject what the worker would reject late or what would exceed the operator's caps;
    fill in ``max_tokens`` when absent. Returns the output tokens the request may use
    (what the token rate limits charge)."""
    check_sampling_lists(body, body_rules.SAMPLING_LISTS)
    if chat:
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise BadRequest(
                "'messages' must be a non-empty list of chat messages", param="messages"
            )
        prompts = 1
    elif "prompt" not in body:
        raise BadRequest("'prompt' is required", param="prompt", code="missing_required_parameter")
    else:
        prompts = count_prompts(body["prompt"], caps)
    requested = _capped(body, body_rules.TOKEN_FIELDS, caps)
    choices = max(n or 1 for n in _capped(body, body_rules.CHOICE_FIELDS, caps))
    # The worker reads max_completion_tokens first, then max_tokens (chat).
    max_tokens = (requested[1] or requested[0]) if chat else requested[0]
    if max_tokens is None:
        fits = caps.max_request_tokens // (prompts * choices)
        default = caps.max_tokens if chat else COMPLETION_DEFAULT_MAX_TOKENS
        bound = chat_prompt_bound(body) if chat else completion_prompt_bound(body["prompt"])
        max_tokens = max(1, min(caps.fitting(default, bound), fits))
        for field in MAX_TOKEN_FIELDS if chat else MAX_TOKEN_FIELDS[:1]:
            body[field] = max_tokens
    total = prompts * choices * max_tokens
    if total > caps.max_request_tokens:
        raise BadRequest(
            f"this request asks for up to {total} output tokens ({_plural(prompts, 'prompt')} "
            f"x {_plural(choices, 'choice')} x {max_tokens} max tokens), above this "
            f"gateway's limit of {caps.max_request_tokens} per request; lower n or max_tokens"
            + ("" if chat else " or send fewer prompts"),
            param="max_tokens",
        )
    _check_fields(body)
    return total


def validate_responses_body(body: dict[str, Any], caps: Caps) -> int:
    """:func:`validate_body` for ``/v1/responses``: ``input`` instead of messages, one
    output of at most ``max_output_tokens`` (filled in when absent), and nothing that reads
    a stored response: responses are not stored here (a worker's store would be one
    replica's, and readable by whoever has a response's id), so a conversation is sent whole
    in ``input``. Returns the output tokens the request may use."""
    check_sampling_lists(body, body_rules.STOP_AND_BIAS)
    given = body.get("input")
    if not (isinstance(given, str) and given) and not (isinstance(given, list) and given):
        raise BadRequest(
            "'input' must be a non-empty string or list of input items",
            param="input",
            code="missing_required_parameter" if given is None else "invalid_value",
        )
    for field in ("previous_response_id", "conversation", "background"):
        if body.get(field):
            raise BadRequest(
                f"'{field}' is not supported: responses are not stored here; "
                "send the whole conversation in 'input' (and 'stream' to "
                "follow a long answer)",
                param=field,
                code="unsupported_parameter",
            )
    cap = min(caps.max_tokens, caps.max_request_tokens)
    max_tokens = _positive_int(
        body, RESPONSES_MAX_TOKENS, body_rules.RESPONSES[RESPONSES_MAX_TOKENS], cap
    )
    if max_tokens is None:
        max_tokens = body[RESPONSES_MAX_TOKENS] = max(
            1, caps.fitting(cap, responses_prompt_bound(body))
        )
    body["store"] = False
    _check_fields(body)
    return max_tokens


def _too_many(param: str, count: int, noun: str, most: int, fewer: str) -> BadRequest:
    return BadRequest(
        f"'{param}' holds {count} {noun}s; at most {most} are accepted: {fewer}", param=param
    )


def _too_long(where: str, param: str, chars: int, most: int, shorter: str) -> BadRequest:
    return BadRequest(
        f"{where} is {chars} characters long; at most {most} are accepted: {shorter}",
        param=param,
    )


def _texts(
    value: Any, param: str, bound: tuple[int, int], noun: str, fewer: str, shorter: str
) -> None:
    """``value`` a list of at most ``bound[0]`` strings of at most ``bound[1]`` characters
    (its length is checked before any element is looked at)."""
    most, chars = bound
    if not isinstance(value, list):
        raise BadRequest(f"'{param}' must be a list of strings", param=param)
    if len(value) > most:
        raise _too_many(param, len(value), noun, most, fewer)
    for index, text in enumerate(value):
        if not isinstance(text, str):
            raise BadRequest(f"'{param}' must be a list of strings", param=param)
        if len(text) > chars:
            raise _too_long(f"{noun} {index} in '{param}'", param, len(text), chars, shorter)


def _ids(value: Any, param: str, most: int, fewer: str) -> None:
    """``value`` null or a list of at most ``most`` non-negative integers."""
    if value is None:
        return
    if not isinstance(value, list):
        raise BadRequest(f"'{param}' must be a list of token ids", param=param)
    if len(value) > most:
        raise _too_many(param, len(value), "token id", most, fewer)
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        raise BadRequest(f"'{param}' must be a list of non-negative integers", param=param)


_SHORTER_STOP = "send a shorter stop sequence"


def _stop(value: Any) -> None:
    if isinstance(value, str):
        if len(value) > MAX_STOP_CHARS:
            raise _too_long("'stop'", "stop", len(value), MAX_STOP_CHARS, _SHORTER_STOP)
    elif value is not None and not isinstance(value, list):
        raise BadRequest("'stop' must be a string or a list of strings", param="stop")
    elif value is not None:
        _texts(
            value,
            "stop",
            (MAX_STOP_SEQUENCES, MAX_STOP_CHARS),
            "stop sequence",
            "end the output at single tokens with 'stop_token_ids' instead",
            _SHORTER_STOP,
        )


def _logit_bias(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise BadRequest(
            "'logit_bias' must be an object of token ids to biases", param="logit_bias"
        )
    if len(value) > MAX_LOGIT_BIAS:
        raise _too_many(
            "logit_bias",
            len(value),
            "token id",
            MAX_LOGIT_BIAS,
            "bias fewer tokens, or restrict the output to a set with 'allowed_token_ids'",
        )


def _structured_outputs(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise BadRequest("'structured_outputs' must be an object", param="structured_outputs")
    if value.get("choice") is not None:
        _texts(
            value["choice"],
            "structured_outputs.choice",
            (MAX_GUIDED_CHOICES, MAX_GUIDED_CHOICE_CHARS),
            "choice",
            "describe a larger set with 'structured_outputs.regex' or '.json' instead",
            "describe longer answers with 'structured_outputs.regex' or '.json' instead",
        )


_SAMPLING_CHECKS: dict[str, Callable[[Any], None]] = {
    "stop": _stop,
    "stop_token_ids": lambda value: _ids(
        value,
        "stop_token_ids",
        MAX_STOP_TOKEN_IDS,
        "list fewer; the model's own end-of-text tokens stop it without being listed",
    ),
    "logit_bias": _logit_bias,
    "structured_outputs": _structured_outputs,
    "bad_words": lambda value: _texts(
        value,
        "bad_words",
        (MAX_BAD_WORDS, MAX_STOP_CHARS),
        "word",
        "lower further tokens with 'logit_bias' instead",
        "send a shorter word",
    ),
    "allowed_token_ids": lambda value: _ids(
        value,
        "allowed_token_ids",
        MAX_ALLOWED_TOKEN_IDS,
        "exclude tokens with 'logit_bias' or 'bad_words' instead",
    ),
}
assert _SAMPLING_CHECKS.keys() == body_rules.SAMPLING_LISTS.keys()


def check_sampling_lists(body: dict[str, Any], fields: Iterable[str]) -> None:
    """The lists vLLM applies on every generated token or step (``body_rules``), each
    within its fixed bound; in time linear in the body, before anything else reads them."""
    for field in fields:
        if field in body:
            _SAMPLING_CHECKS[field](body[field])


NAME_FIELDS = tuple(body_rules.NAMES)


def check_names(body: dict[str, Any]) -> None:
    """The names that pick an adapter (every route that forwards to a worker): strings of
    at most ``MAX_NAME_CHARS``."""
    for field in NAME_FIELDS:
        if body.get(field) is not None and not isinstance(body[field], str):
            raise BadRequest(f"'{field}' must be a string", param=field)
        if isinstance(body.get(field), str) and len(body[field]) > MAX_NAME_CHARS:
            raise BadRequest(
                f"'{field}' is {len(body[field])} characters long; at most "
                f"{MAX_NAME_CHARS} are accepted",
                param=field,
            )


def _check_fields(body: dict[str, Any]) -> None:
    """What every generating route checks alike: names, the gateway's own fields,
    ``stream``."""
    check_names(body)
    _check_worker_internal(body)
    if "request_id" in body:
        # vLLM reads it, but the X-Request-Id the gateway sends every worker takes precedence.
        raise BadRequest(
            "'request_id' in the body is not used here; send your id in the "
            "X-Request-Id header, which names the request in the answer and "
            "the logs",
            param="request_id",
            code="unsupported_parameter",
        )
    if body.get("use_beam_search"):
        raise BadRequest(BEAM_SEARCH_REFUSED, param="use_beam_search", code="unsupported_parameter")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("'stream' must be true or false", param="stream")


# Fields vLLM reads into a request's ``extra_args`` for its KV/encoder-cache connectors and
# scheduler, top-level or through ``vllm_xargs`` (vLLM 0.32: ``to_sampling_params``,
# ``v1/request.py``). They name KV blocks on a worker (a client could read another
# request's prompt KV) and are set by the gateway between its prefill and decode workers.
# The adapter boundary (``common.adapter_boundary``) is the gateway's own: its evaluation
# runner sets it to score an expected answer; a client setting it would change what a
# served adapter computes. So is the tenant (``common.tenant_xarg``): a client naming
# another tenant would spend that tenant's share of a worker's adapter slots.
# vLLM runs beam search as one new request per step with each beam's tokens appended to the
# prompt, built without the request's extra arguments: a prefill-only adapter would be
# applied to the answer, and the worker would not see the tenant it bounds the slots of.
BEAM_SEARCH_REFUSED = (
    "beam search is not served here (a prefill-only adapter would be applied to the beams' "
    "tokens as if they were prompt); remove 'use_beam_search', or ask for several sampled "
    "answers with 'n'"
)
WORKER_INTERNAL_FIELDS = ("kv_transfer_params", "ec_transfer_params")
WORKER_INTERNAL_XARGS = (
    *WORKER_INTERNAL_FIELDS,
    "kv_cache_report_mode",
    ADAPTER_TOKENS_XARG,
    TENANT_XARG,
)
XARGS = "vllm_xargs"
GATEWAY_XARGS: ContextVar[frozenset[str]] = ContextVar("gateway_xargs", default=frozenset())
"""Worker-internal xargs that requests sent from this task may carry: the gateway's own
requests into its app (``gateway.evaluation``) set it; a client's request never runs in
such a task."""


def _check_worker_internal(body: dict[str, Any]) -> None:
    """400 for a worker-internal field, however it is sent."""
    for field in WORKER_INTERNAL_FIELDS:
        if field in body:
            raise BadRequest(
                f"'{field}' is set by the gateway between its workers, never by clients; remove it",
                param=field,
                code="unsupported_parameter",
            )
    xargs = body.get(XARGS)
    if xargs is None:
        return
    if not isinstance(xargs, dict):
        raise BadRequest(f"'{XARGS}' must be an object of extension arguments", param=XARGS)
    for key in WORKER_INTERNAL_XARGS:
        if key in xargs and key not in GATEWAY_XARGS.get():
            raise BadRequest(
                f"'{XARGS}.{key}' is set by the gateway between its workers, "
                "never by clients; remove it",
                param=f"{XARGS}.{key}",
                code="unsupported_parameter",
            )


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# Fields other servers read to pick an adapter (LoRAX, vLLM's Python API, other proxies):
# the gateway must not ignore them and answer from the base model. ``adapter_id`` names an
# adapter as ``model`` does; the others are refused, each with what to use instead.
ADAPTER_ID_FIELD = "adapter_id"
_SELECT_INSTEAD = (
    "name the adapter with 'model' (or 'adapter_id'), or send 'user' to "
    "run that user's bound adapter"
)
_LOAD_INSTEAD = (
    "adapters are uploaded to the registry (POST /v1/adapters) and named with "
    "'model' (or 'adapter_id'), or chosen by 'user'"
)
FOREIGN_ADAPTER_FIELDS: dict[str, str] = {
    "adapter_source": _LOAD_INSTEAD,
    "merged_adapters": _LOAD_INSTEAD,
    "lora_request": _SELECT_INSTEAD,
    "lora_name": _SELECT_INSTEAD,
    "lora": _SELECT_INSTEAD,
    "adapter": _SELECT_INSTEAD,
    "adapters": _SELECT_INSTEAD,
}


def requested_model(body: dict[str, Any], base_name: str) -> str | None:
    """The model the client named: ``model``, or LoRAX's ``adapter_id`` (removed from the
    body; with ``model`` it must agree, unless ``model`` is the base model's name, as LoRAX
    clients send it). Fields that pick or load adapters elsewhere are refused, never
    ignored."""
    if not FOREIGN_ADAPTER_FIELDS.keys().isdisjoint(body):
        field = next(f for f in FOREIGN_ADAPTER_FIELDS if f in body)
        raise BadRequest(
            f"'{field}' is not supported: {FOREIGN_ADAPTER_FIELDS[field]}",
            param=field,
            code="unsupported_parameter",
        )
    model = body.get("model")
    if ADAPTER_ID_FIELD not in body:
        return model
    adapter_id = body.pop(ADAPTER_ID_FIELD)
    if not isinstance(adapter_id, str) or not adapter_id:
        raise BadRequest("'adapter_id' must be an adapter's name", param=ADAPTER_ID_FIELD)
    if len(adapter_id) > MAX_NAME_CHARS:
        raise BadRequest(
            f"'adapter_id' is {len(adapter_id)} characters long; at most "
            f"{MAX_NAME_CHARS} are accepted",
            param=ADAPTER_ID_FIELD,
        )
    if model not in (None, base_name, adapter_id):
        raise BadRequest(
            "'model' and 'adapter_id' name different models; send one of them "
            "(both name the adapter that runs)",
            param=ADAPTER_ID_FIELD,
        )
    return adapter_id


def request_user(body: dict[str, Any], header: str | None) -> str | None:
    """The end user: the body's ``user`` field or ``safety_identifier`` (the openai SDK's
    successor of ``user``; both at once must agree), else the ``X-User-Id`` header."""
    user, safety_identifier = body.get("user"), body.get("safety_identifier")
    if user and safety_identifier and user != safety_identifier:
        raise BadRequest(
            "'user' and 'safety_identifier' name different users; send one of "
            "them (both name the end user whose adapter runs)",
            param="safety_identifier",
        )
    user = user or safety_identifier or header
    if user is not None and len(user) > MAX_NAME_CHARS:
        raise BadRequest(
            f"the user id is {len(user)} characters long; at most {MAX_NAME_CHARS} are accepted",
            param="user",
        )
    return user
