"""Caps on what one completion request may ask for: output tokens (max_tokens, n, prompts),
prompt lists, and JSON nesting depth. Every refusal is a 400 before any worker is called."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from preft_serve.common.adapter_boundary import ADAPTER_TOKENS_XARG
from preft_serve.common.tenant_xarg import TENANT_XARG
from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, MSGS, FakeRegistry, Workers, message


@pytest.fixture
def workers() -> Workers:
    return Workers()


@pytest.fixture
def client(workers: Workers) -> Iterator[TestClient]:
    settings = GatewaySettings(
        worker_urls=["http://w1:8000"],
        base_model_name="tiny",
        max_tokens_cap=100,
        max_request_tokens=400,
        max_choices=8,
        max_prompts=4,
        max_prompt_token_ids=50,
        max_json_depth=32,
    )
    app = create_app(settings, transport=httpx.MockTransport(workers), registry=FakeRegistry())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def chat(client: TestClient, **body: Any) -> httpx.Response:
    return client.post(
        "/v1/chat/completions", json={"messages": MSGS, "user": "u1", **body}, headers=AUTH
    )


def complete(client: TestClient, **body: Any) -> httpx.Response:
    return client.post("/v1/completions", json={"model": "bot", **body}, headers=AUTH)


def refused(
    resp: httpx.Response, workers: Workers, needle: str, code: str = "invalid_value"
) -> None:
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", code)
    if code == "invalid_json":
        assert error["param"] is None
    else:  # OpenAI's param: the field at fault, one the client sent or the one to lower
        assert error["param"] in {*json.loads(resp.request.content), "max_tokens"}, error
    assert needle in message(resp), message(resp)
    assert workers.seen == []  # nothing reached a worker


def test_chat_without_max_tokens_gets_the_cap(client: TestClient, workers: Workers) -> None:
    for body in ({}, {"max_tokens": None, "max_completion_tokens": None}):
        assert chat(client, **body).status_code == 200
        sent = workers.seen[-1]
        assert (sent["max_tokens"], sent["max_completion_tokens"]) == (100, 100)
    # The worker reads max_completion_tokens first, then max_tokens: an explicit one stays.
    assert chat(client, max_tokens=7).status_code == 200
    assert workers.seen[-1]["max_tokens"] == 7 and "max_completion_tokens" not in workers.seen[-1]
    # n choices share the per-request budget: 400 / 8 = 50 tokens each.
    assert chat(client, n=8).status_code == 200
    assert workers.seen[-1]["max_tokens"] == 50


def test_completion_without_max_tokens_gets_the_openai_default(
    client: TestClient, workers: Workers
) -> None:
    assert complete(client, prompt="x").status_code == 200
    assert workers.seen[-1]["max_tokens"] == 16
    assert complete(client, prompt="x", max_tokens=None).status_code == 200  # null = default
    assert workers.seen[-1]["max_tokens"] == 16


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (
            {"n": 1000},
            ("'n' is 1000, above this gateway's limit of 8 choices per request; ask for at most 8"),
        ),
        ({"n": 0}, "'n' must be a positive integer, got 0"),
        ({"n": "2"}, "'n' must be a positive integer, got '2'"),
        ({"best_of": 9}, "'best_of' is 9, above this gateway's limit of 8"),
        (
            {"n": 8, "max_tokens": 100},
            (
                "this request asks for up to 800 output tokens (1 prompt x 8 choices x 100 max "
                "tokens), above this gateway's limit of 400 per request; lower n or max_tokens"
            ),
        ),
        ({"n": 5, "max_completion_tokens": 100}, "up to 500 output tokens"),
    ],
)
def test_choices_and_total_output_are_bounded(
    client: TestClient, workers: Workers, body: dict[str, Any], needle: str
) -> None:
    refused(chat(client, **body), workers, needle)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (
            {"prompt": ["p"] * 1000},
            (
                "'prompt' holds 1000 prompts; at most 4 are accepted per "
                "request: send the rest in further requests"
            ),
        ),
        ({"prompt": [[1, 2]] * 5}, "'prompt' holds 5 prompts; at most 4"),
        ({"prompt": list(range(51))}, "'prompt' has 51 token ids; at most 50 are accepted"),
        ({"prompt": [[1], list(range(60))]}, "prompt 1 has 60 token ids; at most 50"),
        (
            {"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 100},
            (
                "up to 600 output tokens (3 prompts x 2 choices x 100 max tokens), above this "
                "gateway's limit of 400 per request; lower n or max_tokens or send fewer prompts"
            ),
        ),
        (
            {"prompt": ["a", "b"], "n": 3, "max_tokens": 67},
            "up to 402 output tokens (2 prompts x 3 choices x 67 max tokens)",
        ),
        ({"prompt": []}, "'prompt' must not be empty"),
        (
            {"prompt": [1, "a"]},
            (
                "'prompt' must be a string, a list of strings, a list of token "
                "ids or a list of token-id lists"
            ),
        ),
        ({"prompt": [-1]}, "token ids must be non-negative integers"),
        ({"prompt": {"text": "x"}}, "'prompt' must be a string"),
    ],
)
def test_prompt_lists_are_bounded(
    client: TestClient, workers: Workers, body: dict[str, Any], needle: str
) -> None:
    refused(complete(client, **body), workers, needle)


def test_prompt_lists_within_the_caps_pass(client: TestClient, workers: Workers) -> None:
    for prompt in (["a", "b", "c", "d"], list(range(50)), [[1, 2], [3]]):
        assert complete(client, prompt=prompt, max_tokens=10).status_code == 200
        assert workers.seen[-1]["prompt"] == prompt
    # 4 prompts x 7 choices x 16 default tokens = 448 > 400: the default shrinks to 14.
    assert complete(client, prompt=["a", "b", "c", "d"], n=7).status_code == 200
    assert workers.seen[-1]["max_tokens"] == 14


def test_nesting_bomb_is_a_400_not_a_500(client: TestClient, workers: Workers) -> None:
    bomb = b"[" * 100_000
    for path in ("/v1/chat/completions", "/v1/completions"):
        resp = client.post(path, content=bomb, headers=AUTH)
        refused(
            resp,
            workers,
            "request body nests JSON arrays/objects deeper than 32 levels; flatten the request",
            code="invalid_json",
        )
    deep = b'{"messages": ' + b"[" * 40 + b"]" * 40 + b"}"
    refused(
        client.post("/v1/chat/completions", content=deep, headers=AUTH),
        workers,
        "deeper than 32 levels",
        code="invalid_json",
    )
    # Brackets inside strings are text, not nesting.
    text = "[{" * 5000 + '\\"' + "]}" * 10
    ok = chat(client, messages=[{"role": "user", "content": text}])
    assert ok.status_code == 200 and workers.seen[-1]["messages"][0]["content"] == text
    text_metrics = client.get("/metrics").text
    assert 'preft_gateway_errors_total{cause="invalid_json"} 3.0' in text_metrics


def test_clients_cannot_name_kv_blocks(client: TestClient, workers: Workers) -> None:
    """``kv_transfer_params`` points a worker at KV blocks of another request (the two
    pools' handoff): only the gateway may set it."""
    params = {
        "do_remote_prefill": True,
        "remote_block_ids": [[1, 2]],
        "remote_engine_id": "e",
        "remote_host": "10.0.0.1",
        "remote_port": 5600,
    }
    refused(
        chat(client, kv_transfer_params=params),
        workers,
        "never by clients",
        code="unsupported_parameter",
    )
    refused(
        complete(client, prompt="hi", kv_transfer_params=params),
        workers,
        "never by clients",
        code="unsupported_parameter",
    )


@pytest.mark.parametrize(
    "xargs",
    [
        {"kv_transfer_params": {"do_remote_prefill": True, "remote_block_ids": [[1, 2]]}},
        {"ec_transfer_params": {"x": 1}},
        {"kv_cache_report_mode": "all"},
        {ADAPTER_TOKENS_XARG: 3},  # the evaluation gate's adapter boundary
        {TENANT_XARG: "someone-else"},  # whose share of a worker's adapter slots
    ],
)
def test_clients_cannot_reach_worker_internal_fields_through_vllm_xargs(
    client: TestClient, workers: Workers, xargs: dict[str, Any]
) -> None:
    """vLLM copies ``vllm_xargs`` into the request's ``extra_args``, where its KV connector
    reads ``kv_transfer_params`` as it reads the top-level field."""
    (field,) = xargs
    for reply in (chat(client, vllm_xargs=xargs), complete(client, prompt="hi", vllm_xargs=xargs)):
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (error["code"], error["param"]) == ("unsupported_parameter", f"vllm_xargs.{field}")
        assert "never by clients; remove it" in error["message"]
    assert workers.seen == []
    refused(chat(client, vllm_xargs=["kv_transfer_params"]), workers, "must be an object")
    # Other extension arguments still reach the worker as they were sent.
    assert chat(client, vllm_xargs={"my_logits_processor_arg": 3}).status_code == 200
    assert workers.seen[-1]["vllm_xargs"] == {"my_logits_processor_arg": 3}


def _gateway(workers: Workers, **settings: Any) -> TestClient:
    config = GatewaySettings(worker_urls=["http://w1:8000"], base_model_name="tiny", **settings)
    return TestClient(
        create_app(config, transport=httpx.MockTransport(workers), registry=FakeRegistry()),
        raise_server_exceptions=False,
    )


def test_the_filled_in_max_tokens_fits_the_workers_context() -> None:
    """A gateway whose cap (4096) is above the workers' context (1024) fills in what fits
    after the prompt (bounded by its bytes and the chat template's allowance)."""
    workers = Workers(max_model_len=1024)
    with _gateway(workers) as c:
        assert chat(c).status_code == 200
        sent = workers.seen[-1]
        room = 1024 - len(json.dumps(MSGS, separators=(",", ":")).encode()) - 64
        assert sent["max_tokens"] == sent["max_completion_tokens"] == room
        long = [{"role": "user", "content": "é" * 300}]  # 600 bytes: less room
        assert chat(c, messages=long).status_code == 200
        assert workers.seen[-1]["max_tokens"] < room - 500
        # A prompt that may fill the context by its bytes gets a quarter of it.
        assert chat(c, messages=[{"role": "user", "content": "x" * 5000}]).status_code == 200
        assert workers.seen[-1]["max_tokens"] == 256
        # What the client asked for is never changed; the worker judges it.
        assert chat(c, max_tokens=2000).status_code == 200
        assert workers.seen[-1]["max_tokens"] == 2000
        reply = c.post("/v1/responses", json={"input": "hi", "user": "u1"}, headers=AUTH)
        assert reply.status_code == 200, reply.text
        assert workers.seen[-1]["max_output_tokens"] == 1024 - len(b"hi") - 64


def test_the_default_stays_the_cap_while_no_worker_reported_a_context() -> None:
    workers = Workers()
    with _gateway(workers, max_tokens_cap=300) as c:
        assert chat(c).status_code == 200
        assert workers.seen[-1]["max_tokens"] == 300


def test_a_request_id_in_the_body_is_refused_for_the_header(
    client: TestClient, workers: Workers
) -> None:
    """vLLM would name the request after it, but the gateway's X-Request-Id wins: the field
    would be silently ignored."""
    refused(
        chat(client, request_id="mine"),
        workers,
        "X-Request-Id header",
        code="unsupported_parameter",
    )
    refused(
        complete(client, prompt="hi", request_id="mine"),
        workers,
        "X-Request-Id header",
        code="unsupported_parameter",
    )


def test_beam_search_is_refused_before_any_worker(client: TestClient, workers: Workers) -> None:
    """vLLM runs it as new requests with the beams' tokens in the prompt, where a
    prefill-only adapter would apply to them."""
    for reply in (
        chat(client, use_beam_search=True),
        complete(client, prompt="hi", use_beam_search=True),
    ):
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (error["code"], error["param"]) == ("unsupported_parameter", "use_beam_search")
        assert "ask for several sampled answers with 'n'" in error["message"]
    assert workers.seen == []
    assert chat(client, use_beam_search=False).status_code == 200
