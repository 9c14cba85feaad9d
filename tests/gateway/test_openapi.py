"""The gateway's OpenAPI document describes the completion bodies and every answer.

Found while fuzzing the gateway from its document (tests/fuzz/test_gateway_api.py): the
completion routes documented no request body at all (so neither clients nor a fuzzer could
know what to send), no 429 though the rate limiter answers one, and only JSON for 200
though ``"stream": true`` answers with server-sent events.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from preft_serve.common.errors import BadRequest
from preft_serve.gateway.app import create_app
from preft_serve.gateway.responses_handler import check_tools
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.gateway.validation import (
    Caps,
    request_user,
    requested_model,
    validate_body,
    validate_responses_body,
)

CAPS = Caps(
    max_tokens=100,
    max_request_tokens=400,
    max_choices=8,
    max_prompts=4,
    max_prompt_token_ids=50,
    max_json_depth=32,
)


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return create_app(
        GatewaySettings(worker_urls=["http://w1:8000"], base_model_name="tiny")
    ).openapi()


def _body_schema(spec: dict[str, Any], path: str) -> dict[str, Any]:
    body = spec["paths"][path]["post"]["requestBody"]
    assert body["required"] is True
    return body["content"]["application/json"]["schema"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_completion_routes_document_body_stream_and_429(spec: dict[str, Any], path: str) -> None:
    op = spec["paths"][path]["post"]
    assert {"200", "400", "401", "404", "413", "429", "502", "503"} <= set(op["responses"])
    assert set(op["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    schema = _body_schema(spec, path)
    assert schema["required"] == (["messages"] if "chat" in path else ["prompt"])
    assert schema["additionalProperties"] is True  # other fields pass through to vLLM
    for example in schema["examples"]:
        jsonschema.validate(example, schema)
        validate_body(dict(example), chat="chat" in path, caps=CAPS)


# Bodies the document forbids; the gateway must refuse every one (400), never forward it.
FORBIDDEN = [
    {"messages": []},
    {"messages": "hi"},
    {},
    {"messages": [{}], "max_tokens": 0},
    {"messages": [{}], "max_tokens": "8"},
    {"messages": [{}], "n": True},
    {"messages": [{}], "best_of": -1},
    {"messages": [{}], "max_completion_tokens": 0},
    {"messages": [{}], "stream": "yes"},
    {"messages": [{}], "stream": None},
    {"messages": [{}], "model": 5},
    {"messages": [{}], "user": ["u"]},
    {"messages": [{}], "user": "u" * 257},
    {"messages": [{}], "safety_identifier": 5},
    {"messages": [{}], "safety_identifier": "u" * 257},
    {"messages": [{}], "stop": "s" * 257},
    {"messages": [{}], "stop": ["s"] * 5},
    {"messages": [{}], "stop": ["s" * 257]},
    {"messages": [{}], "stop": 7},
    {"messages": [{}], "stop_token_ids": list(range(65))},
    {"messages": [{}], "stop_token_ids": [-1]},
    {"messages": [{}], "bad_words": ["w"] * 65},
    {"messages": [{}], "bad_words": None},
    {"messages": [{}], "logit_bias": {str(i): 1 for i in range(301)}},
    {"messages": [{}], "allowed_token_ids": list(range(1025))},
    {"messages": [{}], "structured_outputs": {"choice": ["c"] * 257}},
    {"messages": [{}], "structured_outputs": {"choice": ["c" * 257]}},
    {"messages": [{}], "structured_outputs": "c"},
]
PROMPTS: list[Any] = [
    [],
    [[]],
    [-1],
    [1, "a"],
    ["a", 1],
    [[1], "a"],
    {"text": "x"},
    7,
    None,
    [True],
]
FORBIDDEN_PROMPTS = [{"prompt": p} for p in PROMPTS] + [
    {"prompt": "x", "max_completion_tokens": 0},
    {"prompt": "x", "safety_identifier": 5},
    {"prompt": "x", "stop": ["s"] * 5},
    {"prompt": "x", "bad_words": ["w" * 257]},
    {"prompt": "x", "allowed_token_ids": ["1"]},
]
FORBIDDEN_RESPONSES = [
    {},
    {"input": ""},
    {"input": []},
    {"input": 7},
    {"input": "x", "max_output_tokens": 0},
    {"input": "x", "max_output_tokens": "8"},
    {"input": "x", "stream": "yes"},
    {"input": "x", "model": 5},
    {"input": "x", "safety_identifier": "u" * 257},
    {"input": "x", "adapter_id": ""},
    {"input": "x", "tools": "all"},
    {"input": "x", "stop": "s" * 257},
    {"input": "x", "stop_token_ids": list(range(65))},
    {"input": "x", "logit_bias": {str(i): 1 for i in range(301)}},
    {"input": "x", "structured_outputs": {"choice": ["c"] * 257}},
]


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/chat/completions", b) for b in FORBIDDEN]
    + [("/v1/completions", b) for b in FORBIDDEN_PROMPTS],
)
def test_what_the_document_forbids_the_gateway_refuses(
    spec: dict[str, Any], path: str, body: dict[str, Any]
) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, _body_schema(spec, path))
    with pytest.raises(BadRequest):
        validate_body(dict(body), chat="chat" in path, caps=CAPS)


@pytest.mark.parametrize("body", FORBIDDEN_RESPONSES)
def test_what_the_document_forbids_in_a_response_the_gateway_refuses(
    spec: dict[str, Any], body: dict[str, Any]
) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, _body_schema(spec, "/v1/responses"))
    with pytest.raises(BadRequest):  # every check the route makes before a worker sees it
        body = dict(body)
        validate_responses_body(body, CAPS)
        check_tools(body, enabled=True)
        requested_model(body, "tiny")
        request_user(body, None)


# The largest per-token lists accepted (fixed bounds, not settings).
LARGEST_LISTS: dict[str, Any] = {
    "stop": ["s" * 256] * 4,
    "stop_token_ids": list(range(64)),
    "logit_bias": {str(i): 1 for i in range(300)},
    "structured_outputs": {"choice": ["c" * 256] * 256},
}
LARGEST_LISTS_NOT_IN_RESPONSES: dict[str, Any] = {
    "bad_words": ["w" * 256] * 64,
    "allowed_token_ids": list(range(1024)),
}


def test_the_document_shows_the_per_token_lists_bounds(spec: dict[str, Any]) -> None:
    """The bounds are in the schemas, and the largest lists they allow pass the gateway."""
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        schema = _body_schema(spec, path)
        fields = schema["properties"]
        stop = fields["stop"]["anyOf"]
        assert stop[0] == {"type": "string", "maxLength": 256}
        assert (stop[1]["maxItems"], stop[1]["items"]["maxLength"]) == (4, 256)
        assert fields["stop_token_ids"]["maxItems"] == 64
        assert fields["logit_bias"]["maxProperties"] == 300
        choice = fields["structured_outputs"]["properties"]["choice"]
        assert (choice["maxItems"], choice["items"]["maxLength"]) == (256, 256)
        largest = dict(LARGEST_LISTS)
        if path == "/v1/responses":
            assert not {"bad_words", "allowed_token_ids"} & set(fields)
            body = {"input": "x", **largest}
            jsonschema.validate(body, schema)
            validate_responses_body(body, CAPS)
            continue
        assert fields["allowed_token_ids"]["maxItems"] == 1024
        bad_words = fields["bad_words"]
        assert (bad_words["maxItems"], bad_words["items"]["maxLength"]) == (64, 256)
        largest |= LARGEST_LISTS_NOT_IN_RESPONSES
        body = {"messages": [{}], **largest} if "chat" in path else {"prompt": "x", **largest}
        jsonschema.validate(body, schema)
        validate_body(body, chat="chat" in path, caps=CAPS)


def test_the_document_tenants_read_names_no_server_setting(spec: dict[str, Any]) -> None:
    """It is served to every tenant: limits are described by what they bound; a refusal
    states the value."""
    text = json.dumps(spec)
    assert "PREFT_" not in text
    assert "this gateway's cap on max_tokens" in text
