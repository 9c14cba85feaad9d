"""``POST /v1/responses``: the completion routes' adapter selection, model rewrite, caps,
usage accounting, errors and headers, in the Responses API's shapes (``input``,
``max_output_tokens``, typed events, ``input_tokens`` / ``output_tokens``), with the
official ``openai`` client. The worker answers as vLLM's Responses server does (compact
JSON, ``event:`` + ``data:`` lines)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from openai import OpenAI

from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, KEY, SHA, FakeRegistry

USAGE = {
    "input_tokens": 7,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 4,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 11,
}


def _compact(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"))


class ResponsesWorker:
    """Records what reached it; answers like vLLM's /v1/responses (or ``fail`` with an
    error of vLLM's shape)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.fail: int | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"object": "list", "data": []})
        body = json.loads(request.content)
        self.seen.append(body)
        if self.fail:
            return httpx.Response(
                self.fail,
                json={
                    "error": {
                        "message": "bad input item",
                        "type": "BadRequestError",
                        "param": "input",
                        "code": self.fail,
                    }
                },
            )
        response = {
            "id": "resp_1",
            "object": "response",
            "created_at": 1,
            "model": body["model"],
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "hi there", "annotations": []}],
                }
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": USAGE,
        }
        if not body.get("stream"):
            return httpx.Response(200, json=response)
        running = {**response, "status": "in_progress", "output": [], "usage": None}
        events = [
            (
                "response.created",
                {"type": "response.created", "response": running, "sequence_number": 0},
            ),
            *[
                (
                    "response.output_text.delta",
                    {
                        "type": "response.output_text.delta",
                        "delta": d,
                        "item_id": "msg_1",
                        "output_index": 0,
                        "content_index": 0,
                        "logprobs": [],
                        "sequence_number": i + 1,
                    },
                )
                for i, d in enumerate(["hi", " there"])
            ],
            (
                "response.completed",
                {"type": "response.completed", "response": response, "sequence_number": 3},
            ),
        ]
        text = "".join(f"event: {kind}\ndata: {_compact(data)}\n\n" for kind, data in events)
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})


@pytest.fixture
def worker() -> ResponsesWorker:
    return ResponsesWorker()


@pytest.fixture
def client(worker: ResponsesWorker) -> Iterator[TestClient]:
    settings = GatewaySettings(
        worker_urls=["http://w1:8000"],
        base_model_name="tiny",
        worker_base_model="/models/tiny",
        max_tokens_cap=64,
    )
    app = create_app(settings, transport=httpx.MockTransport(worker), registry=FakeRegistry())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def sdk(client: TestClient) -> OpenAI:
    return OpenAI(base_url="http://testserver/v1", api_key=KEY, max_retries=0, http_client=client)


def _metric(client: TestClient, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_the_users_adapter_answers_with_its_name_usage_counted(
    sdk: OpenAI, client: TestClient, worker: ResponsesWorker
) -> None:
    raw = sdk.responses.with_raw_response.create(model="tiny", input="hello", user="u1")
    reply = raw.parse()
    assert reply.model == "bot" and reply.output_text == "hi there"
    assert raw.headers["x-preft-adapter"] == "bot" and raw.headers["x-preft-adapter-sha256"] == SHA
    sent = worker.seen[-1]
    assert sent["model"] == f"sha256:{SHA}" and sent["max_output_tokens"] == 64
    assert sent["store"] is False
    assert _metric(client, 'preft_gateway_prompt_tokens_total{adapter="bot"}') == 7
    assert _metric(client, 'preft_gateway_generation_tokens_total{adapter="bot"}') == 4


def test_a_stream_is_relayed_event_by_event_with_the_adapters_name(
    sdk: OpenAI, client: TestClient
) -> None:
    with sdk.responses.with_streaming_response.create(input="hello", user="u1", stream=True) as raw:
        assert raw.headers["x-preft-adapter"] == "bot"
        events = list(raw.parse())
    assert [e.type for e in events] == [
        "response.created",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.completed",
    ]
    assert events[0].response.model == events[-1].response.model == "bot"  # type: ignore[union-attr]
    assert SHA not in json.dumps([e.model_dump() for e in events])
    assert _metric(client, 'preft_gateway_generation_tokens_total{adapter="bot"}') == 4
    assert _metric(client, 'preft_gateway_ttft_seconds_count{adapter="bot"}') == 1


def test_the_base_model_and_adapter_id_say_which_adapter_served(
    client: TestClient, worker: ResponsesWorker
) -> None:
    base = client.post("/v1/responses", headers=AUTH, json={"model": "tiny", "input": "hi"})
    assert base.status_code == 200 and base.headers["x-preft-adapter"] == "none"
    assert worker.seen[-1]["model"] == "/models/tiny" and base.json()["model"] == "tiny"
    lorax = client.post("/v1/responses", headers=AUTH, json={"adapter_id": "bot", "input": "hi"})
    assert lorax.status_code == 200 and lorax.headers["x-preft-adapter"] == "bot"
    assert "adapter_id" not in worker.seen[-1]


@pytest.mark.parametrize(
    ("body", "status", "param", "says"),
    [
        ({}, 400, "input", "'input' must be"),
        ({"input": []}, 400, "input", "'input' must be"),
        ({"input": "hi", "max_output_tokens": 65}, 400, "max_output_tokens", "cap of 64"),
        ({"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens", "positive"),
        (
            {"input": "hi", "previous_response_id": "resp_9"},
            400,
            "previous_response_id",
            "not stored",
        ),
        ({"input": "hi", "background": True}, 400, "background", "not stored"),
        ({"input": "hi", "lora_name": "bot"}, 400, "lora_name", "'model'"),
        ({"input": "hi", "stream": "yes"}, 400, "stream", "true or false"),
        ({"input": "hi"}, 400, "model", "say which model"),
        ({"input": "hi", "model": "nope"}, 404, "model", "does not exist"),
        ({"input": "hi", "user": "nobody"}, 404, "user", "no adapter binding"),
    ],
)
def test_refusals_are_the_envelope_and_reach_no_worker(
    client: TestClient,
    worker: ResponsesWorker,
    body: dict[str, Any],
    status: int,
    param: str,
    says: str,
) -> None:
    resp = client.post("/v1/responses", headers=AUTH, json=body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and says in error["message"], error
    assert worker.seen == []


def test_errors_of_the_worker_and_of_authentication(
    sdk: OpenAI, client: TestClient, worker: ResponsesWorker
) -> None:
    worker.fail = 400
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.responses.create(model="bot", input=[{"role": "user", "content": "hi"}])
    assert bad.value.code == "invalid_value" and bad.value.param == "input"
    assert bad.value.type == "invalid_request_error"
    anonymous = client.post("/v1/responses", json={"model": "bot", "input": "hi"})
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "missing_api_key"


def test_the_route_is_documented(client: TestClient) -> None:
    operation = client.get("/openapi.json").json()["paths"]["/v1/responses"]["post"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["input"] and "max_output_tokens" in schema["properties"]
    assert set(operation["responses"]["200"]["content"]) == {
        "application/json",
        "text/event-stream",
    }
    assert operation["security"] == [{"TenantApiKey": []}]


def test_langchain_with_the_responses_api_runs_the_adapter(
    client: TestClient, worker: ResponsesWorker
) -> None:
    """LangChain's ``ChatOpenAI(use_responses_api=True)`` (the default route of agent
    frameworks), whole and streamed: the adapter's answer, its usage, the adapter named."""
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model="bot",
        base_url="http://testserver/v1",
        api_key=KEY,
        http_client=client,
        use_responses_api=True,
        max_retries=0,
    )
    reply = chat.invoke("hello")
    assert reply.text == "hi there"
    assert reply.usage_metadata is not None
    assert (reply.usage_metadata["input_tokens"], reply.usage_metadata["output_tokens"]) == (7, 4)
    assert reply.response_metadata["model_name"] == "bot"
    sent = worker.seen[-1]
    assert sent["model"] == f"sha256:{SHA}" and sent["input"] and not sent.get("stream")
    streamed = list(chat.stream("hello"))
    assert "".join(chunk.text for chunk in streamed) == "hi there"
    assert worker.seen[-1]["stream"] is True


TOOLS = [
    {
        "type": "function",
        "name": "now",
        "description": "The time",
        "parameters": {"type": "object", "properties": {}},
    }
]


@pytest.mark.parametrize(
    "body",
    [
        {"tools": TOOLS},
        {"tools": TOOLS, "tool_choice": "auto"},
        {"tools": TOOLS, "tool_choice": "required"},
        {"tools": TOOLS, "tool_choice": {"type": "function", "name": "now"}},
        {"tool_choice": "required"},
    ],
)
def test_tool_calls_are_refused_without_a_tool_parser(
    client: TestClient, worker: ResponsesWorker, body: dict[str, Any]
) -> None:
    """The workers' Responses server would answer in plain text, ignoring the tools: the
    request is refused as chat completions refuse it, and nothing is billed."""
    resp = client.post(
        "/v1/responses", headers=AUTH, json={"model": "bot", "input": "what time is it?", **body}
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "tool_calling_disabled"
    assert error["param"] == ("tools" if "tools" in body else "tool_choice")
    assert "without 'tools'" in error["message"] and "--" not in error["message"]
    assert worker.seen == []
    assert _metric(client, 'preft_gateway_prompt_tokens_total{adapter="bot"}') == 0
    assert _metric(client, 'preft_gateway_errors_total{cause="tool_calling_disabled"}') == 1


def test_tools_the_client_turned_off_are_allowed(
    client: TestClient, worker: ResponsesWorker
) -> None:
    resp = client.post(
        "/v1/responses",
        headers=AUTH,
        json={"model": "bot", "input": "hi", "tools": TOOLS, "tool_choice": "none"},
    )
    assert resp.status_code == 200, resp.text
    assert worker.seen[-1]["tools"] == TOOLS and worker.seen[-1]["tool_choice"] == "none"


def test_tools_reach_workers_with_a_tool_parser(worker: ResponsesWorker) -> None:
    settings = GatewaySettings(
        worker_urls=["http://w1:8000"], base_model_name="tiny", tool_calling=True
    )
    app = create_app(settings, transport=httpx.MockTransport(worker), registry=FakeRegistry())
    with TestClient(app) as tools_on:
        resp = tools_on.post(
            "/v1/responses",
            headers=AUTH,
            json={
                "model": "bot",
                "input": "what time is it?",
                "tools": TOOLS,
                "tool_choice": "required",
            },
        )
    assert resp.status_code == 200, resp.text
    assert worker.seen[-1]["tools"] == TOOLS and worker.seen[-1]["tool_choice"] == "required"


def test_malformed_tools_are_refused(client: TestClient, worker: ResponsesWorker) -> None:
    for body, param in (({"tools": "now"}, "tools"), ({"tool_choice": 3}, "tool_choice")):
        resp = client.post(
            "/v1/responses", headers=AUTH, json={"model": "bot", "input": "hi", **body}
        )
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param
    assert worker.seen == []
