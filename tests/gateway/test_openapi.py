"""The gateway's OpenAPI document describes the completion bodies and every answer.

Found while fuzzing the gateway from its document (tests/fuzz/test_gateway_api.py): the
completion routes documented no request body at all (so neither clients nor a fuzzer could
know what to send), no 429 though the rate limiter answers one, and only JSON for 200
though ``"stream": true`` answers with server-sent events.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from preft_serve.common.errors import BadRequest
from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.gateway.validation import Caps, validate_body

CAPS = Caps(max_tokens=100, max_request_tokens=400, max_choices=8, max_prompts=4,
            max_prompt_token_ids=50, max_json_depth=32)


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return create_app(GatewaySettings(worker_urls=["http://w1:8000"],
                                      base_model_name="tiny")).openapi()


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
    {"messages": []}, {"messages": "hi"}, {},
    {"messages": [{}], "max_tokens": 0}, {"messages": [{}], "max_tokens": "8"},
    {"messages": [{}], "n": True}, {"messages": [{}], "best_of": -1},
    {"messages": [{}], "max_completion_tokens": 0}, {"messages": [{}], "stream": "yes"},
    {"messages": [{}], "stream": None}, {"messages": [{}], "model": 5},
    {"messages": [{}], "user": ["u"]}, {"messages": [{}], "user": "u" * 257},
]
FORBIDDEN_PROMPTS = [{"prompt": p} for p in ([], [[]], [-1], [1, "a"], ["a", 1], [[1], "a"],
                                              {"text": "x"}, 7, None, [True])]


@pytest.mark.parametrize(("path", "body"),
                         [("/v1/chat/completions", b) for b in FORBIDDEN]
                         + [("/v1/completions", b) for b in FORBIDDEN_PROMPTS])
def test_what_the_document_forbids_the_gateway_refuses(spec: dict[str, Any], path: str,
                                                       body: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, _body_schema(spec, path))
    with pytest.raises(BadRequest):
        validate_body(dict(body), chat="chat" in path, caps=CAPS)
