"""``/tokenize``, ``/detokenize`` and ``/version`` behind the gateway: the tenant's key and
``model`` are checked as for a completion, the worker tokenizes with its base model (the
tokenizer every adapter shares), and its answers and errors come back in the gateway's
envelope. A real worker's answers: tests/gateway/test_e2e.py."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from fastapi.testclient import TestClient

from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, PATIENT_LIMITER_S, FakeRegistry

WORKER = "http://w0:8000"


class Tokenizer:
    """A worker's tokenizer routes: ids are the prompt's character codes."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.max_model_len: int | None = None  # listed in /v1/models when set

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            if request.url.path == "/version":
                return httpx.Response(200, json={"version": "0.32.0"})
            data = (
                []
                if self.max_model_len is None
                else [
                    {"id": "/models/tiny", "object": "model", "max_model_len": self.max_model_len}
                ]
            )
            return httpx.Response(200, json={"object": "list", "data": data})
        body = json.loads(request.content)
        self.seen.append((request.url.path, body))
        if request.url.path == "/tokenize":
            ids = [ord(c) for c in body["prompt"]]
            return httpx.Response(
                200, json={"tokens": ids, "count": len(ids), "max_model_len": 256}
            )
        if any(t > 0x10FFFF for t in body["tokens"]):
            return httpx.Response(
                400,
                json={
                    "error": {
                        "message": "token id out of range",
                        "type": "BadRequestError",
                        "param": None,
                        "code": 400,
                    }
                },
            )
        return httpx.Response(200, json={"prompt": "".join(map(chr, body["tokens"]))})


@pytest.fixture
def worker() -> Tokenizer:
    return Tokenizer()


@pytest.fixture
def client(worker: Tokenizer) -> Iterator[TestClient]:
    settings = GatewaySettings(
        worker_urls=[WORKER], base_model_name="tiny", worker_base_model="/models/tiny"
    )
    app = create_app(settings, transport=httpx.MockTransport(worker), registry=FakeRegistry())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("model", ["bot", "tiny", None])
def test_tokenize_runs_the_base_models_tokenizer(
    client: TestClient, worker: Tokenizer, model: str | None
) -> None:
    body = {"prompt": "hi"} | ({"model": model} if model else {})
    reply = client.post("/tokenize", headers=AUTH, json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["tokens"] == [104, 105]
    path, sent = worker.seen[-1]
    assert path == "/tokenize" and sent == {"prompt": "hi", "model": "/models/tiny"}


def test_detokenize_round_trips_and_relays_worker_errors(
    client: TestClient, worker: Tokenizer
) -> None:
    reply = client.post("/detokenize", headers=AUTH, json={"model": "bot", "tokens": [104, 105]})
    assert reply.status_code == 200 and reply.json() == {"prompt": "hi"}
    bad = client.post("/detokenize", headers=AUTH, json={"tokens": [2**40]})
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert (error["message"], error["type"], error["code"]) == (
        "token id out of range",
        "invalid_request_error",
        "invalid_value",
    )


@pytest.mark.parametrize("model", ["rival", "nope"])  # another tenant's, and no one's
def test_an_adapter_the_tenant_lacks_is_a_404_and_reaches_no_worker(
    client: TestClient, worker: Tokenizer, model: str
) -> None:
    reply = client.post("/tokenize", headers=AUTH, json={"model": model, "prompt": "hi"})
    assert reply.status_code == 404
    assert reply.json()["error"]["message"] == (
        f"model '{model}' does not exist; GET /v1/models lists yours"
    )
    assert worker.seen == []


def test_without_a_key_or_with_a_foreign_adapter_field_nothing_is_sent(
    client: TestClient, worker: Tokenizer
) -> None:
    assert client.post("/tokenize", json={"prompt": "hi"}).status_code == 401
    assert client.get("/version").status_code == 401
    refused = client.post("/tokenize", headers=AUTH, json={"prompt": "hi", "lora_name": "x"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "lora_name"
    not_object = client.post("/tokenize", headers=AUTH, content=b"[1, 2]")
    assert not_object.status_code == 400
    assert worker.seen == []


def test_version_is_the_workers(client: TestClient) -> None:
    reply = client.get("/version", headers=AUTH)
    assert reply.status_code == 200 and reply.json() == {"version": "0.32.0"}


def _gateway(worker: Tokenizer, redis_url: str | None = None, **settings: Any) -> TestClient:
    settings.setdefault("ratelimit_timeout_s", PATIENT_LIMITER_S)
    config = GatewaySettings(
        worker_urls=[WORKER],
        base_model_name="tiny",
        worker_base_model="/models/tiny",
        namespace=f"tok{uuid.uuid4().hex[:8]}",
        **settings,
    )
    app = create_app(
        config,
        transport=httpx.MockTransport(worker),
        registry=FakeRegistry(),
        redis_client=aioredis.Redis.from_url(redis_url) if redis_url else None,
    )
    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize(
    ("path", "body"),
    [("/tokenize", {"prompt": "x" * 5000}), ("/detokenize", {"tokens": [104] * 2000})],
)
def test_a_body_over_the_limit_is_413_stating_it_in_bytes(
    worker: Tokenizer, path: str, body: dict[str, Any]
) -> None:
    with _gateway(worker, max_body_bytes=4096) as client:
        reply = client.post(path, headers=AUTH, json=body)
    assert reply.status_code == 413
    error = reply.json()["error"]
    assert error["code"] == "request_too_large" and "4096-byte limit" in error["message"]
    assert "PREFT_" not in error["message"]
    assert worker.seen == []


def test_detokenize_holds_no_more_ids_than_a_token_id_prompt(worker: Tokenizer) -> None:
    with _gateway(worker, max_prompt_token_ids=8) as client:
        refused = client.post("/detokenize", headers=AUTH, json={"tokens": [104] * 9})
        fits = client.post("/detokenize", headers=AUTH, json={"tokens": [104] * 8})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "tokens" and error["type"] == "invalid_request_error"
    assert error["message"] == (
        "'tokens' holds 9 token ids, more than the 8 this gateway "
        "accepts in one prompt; send at most 8"
    )
    assert fits.status_code == 200 and [p for p, _ in worker.seen] == ["/detokenize"]


def test_detokenize_holds_no_more_ids_than_the_workers_context(worker: Tokenizer) -> None:
    worker.max_model_len = 16  # listed in the worker's /v1/models, as vLLM does
    with _gateway(worker) as client:
        deadline = time.monotonic() + 10
        while client.app.state.gateway.caps.context.max_model_len is None:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "the health poll never read the context"
            time.sleep(0.05)
        refused = client.post("/detokenize", headers=AUTH, json={"tokens": [104] * 17})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["param"], error["code"]) == ("tokens", "context_length_exceeded")
    assert "more than the 16 the model's context length" in error["message"]
    assert worker.seen == []


@pytest.mark.parametrize(
    "body", [{"tokens": "hi"}, {"tokens": [1, -2]}, {"tokens": [1.5]}, {"tokens": [True]}, {}]
)
def test_detokenize_of_anything_but_token_ids_is_400(
    client: TestClient, worker: Tokenizer, body: dict[str, Any]
) -> None:
    reply = client.post("/detokenize", headers=AUTH, json=body)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "tokens"
    assert worker.seen == []


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"prompt": [2.5, {"a": 1}]}, "prompt", "'prompt' must be a string"),
        ({"prompt": 7}, "prompt", "'prompt' must be a string"),
        ({"messages": {"role": "user"}}, "messages", "non-empty list of chat messages"),
        ({"messages": []}, "messages", "non-empty list of chat messages"),
    ],
)
def test_tokenize_of_text_in_another_shape_is_400_before_any_worker(
    client: TestClient, worker: Tokenizer, body: dict[str, Any], param: str, says: str
) -> None:
    reply = client.post("/tokenize", headers=AUTH, json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and says in error["message"]
    assert worker.seen == []


@pytest.mark.parametrize("field", ["user", "safety_identifier", "model"])
def test_a_name_that_is_not_a_string_is_400(
    client: TestClient, worker: Tokenizer, field: str
) -> None:
    reply = client.post("/tokenize", headers=AUTH, json={"prompt": "hi", field: 7})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == field
    assert worker.seen == []


def test_tokenizer_routes_share_the_tenants_and_users_rate_limits(
    redis_server: str, worker: Tokenizer
) -> None:
    with _gateway(
        worker, redis_server, tenant_rps=0.1, tenant_burst=3, user_rps=0.1, user_burst=1
    ) as client:
        assert (
            client.post("/tokenize", headers=AUTH, json={"prompt": "hi", "user": "u1"}).status_code
            == 200
        )
        by_user = client.post(
            "/detokenize", headers={**AUTH, "X-User-Id": "u1"}, json={"tokens": [104]}
        )
        assert by_user.status_code == 429
        assert by_user.json()["error"]["message"].startswith(
            "rate limit exceeded for user u1: 0.1 requests/s"
        )
        assert client.post("/detokenize", headers=AUTH, json={"tokens": [104]}).status_code == 200
        assert client.get("/version", headers=AUTH).status_code == 200
        over = [
            client.post("/tokenize", headers=AUTH, json={"prompt": "hi"}),
            client.get("/version", headers=AUTH),
            client.post(
                "/v1/chat/completions",
                headers=AUTH,
                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            ),
        ]
        text = client.get("/metrics").text
    for reply in over:  # the tenant's bucket is empty: each route refuses alike
        assert reply.status_code == 429 and reply.headers["Retry-After"] == "10"
        assert reply.json()["error"]["message"].startswith(
            "rate limit exceeded for tenant acme: 0.1 requests/s with bursts of 3"
        )
    assert [p for p, _ in worker.seen] == ["/tokenize", "/detokenize"]
    assert 'preft_gateway_rate_limited_total{scope="tenant"} 3.0' in text
    assert 'preft_gateway_rate_limited_total{scope="user"} 1.0' in text


def test_the_gateways_open_request_cap_sheds_tokenizer_calls(worker: Tokenizer) -> None:
    with _gateway(worker, max_open_requests=1) as client:
        pool = client.app.state.gateway.pool  # type: ignore[attr-defined]
        pool.acquire(WORKER)  # one request open already (a slow completion, say)
        try:
            shed = [
                client.post("/tokenize", headers=AUTH, json={"prompt": "hi"}),
                client.post("/detokenize", headers=AUTH, json={"tokens": [104]}),
                client.get("/version", headers=AUTH),
            ]
        finally:
            pool.release(WORKER)
        assert client.post("/tokenize", headers=AUTH, json={"prompt": "hi"}).status_code == 200
        assert pool.open_requests() == 0  # the slot went back when the answer was read
    assert [r.status_code for r in shed] == [503] * 3
    assert [p for p, _ in worker.seen] == ["/tokenize"]
