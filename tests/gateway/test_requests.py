"""Request handling without a network: a fake registry and MockTransport workers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, MSGS, SHA, FakeRegistry, Workers, message


@pytest.fixture
def workers() -> Workers:
    return Workers()


@pytest.fixture
def client(workers: Workers) -> Iterator[TestClient]:
    settings = GatewaySettings(
        worker_urls=["http://w1:8000", "http://w2:8000"],
        base_model_name="tiny",
        worker_base_model="/models/tiny",
        max_tokens_cap=100,
        max_body_bytes=4096,
    )
    app = create_app(settings, transport=httpx.MockTransport(workers), registry=FakeRegistry())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def chat(client: TestClient, headers: dict[str, str] | None = None, **body: Any) -> Any:
    return client.post(
        "/v1/chat/completions",
        json={"messages": MSGS, **body},
        headers=AUTH if headers is None else headers,
    )


def test_missing_and_wrong_keys_are_401(client: TestClient) -> None:
    missing = chat(client, headers={}, user="u1")
    wrong = chat(client, headers={"Authorization": "Bearer nope"}, user="u1")
    assert missing.status_code == wrong.status_code == 401
    assert "Authorization: Bearer" in message(missing)
    assert "invalid API key" in message(wrong)


def test_user_binding_rewrites_model_both_ways(client: TestClient, workers: Workers) -> None:
    resp = chat(client, user="u1", max_tokens=10)
    assert resp.status_code == 200, resp.text
    assert workers.seen[-1]["model"] == f"sha256:{SHA}"
    assert resp.json()["model"] == "bot"
    header = chat(client, headers={**AUTH, "X-User-Id": "u1"})
    assert header.status_code == 200 and workers.seen[-1]["model"] == f"sha256:{SHA}"


def test_model_selection_rules(client: TestClient, workers: Workers) -> None:
    assert chat(client, model="bot").json()["model"] == "bot"
    base = chat(client, model="tiny", user="stranger")
    assert base.status_code == 200 and workers.seen[-1]["model"] == "/models/tiny"
    assert base.json()["model"] == "tiny"
    assert chat(client, model="tiny", user="u1").json()["model"] == "bot"
    unknown = chat(client, user="u2")
    assert unknown.status_code == 404
    assert message(unknown) == "user u2 has no adapter binding; bind one with PUT /v1/users/u2"
    other = chat(client, model="someone-elses")
    assert other.status_code == 404 and "does not exist" in message(other)
    neither = chat(client)
    assert neither.status_code == 400 and "X-User-Id" in message(neither)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"max_tokens": 101}, "cap of 100"),
        ({"max_completion_tokens": 1000}, "cap of 100"),
        ({"max_tokens": 0}, "positive integer"),
        ({"max_tokens": "5"}, "positive integer"),
        ({"messages": []}, "'messages'"),
        ({"user": 5}, "'user' must be a string"),
        ({"stream": "yes"}, "'stream'"),
        ({"user": "u" * 300}, "'user' is 300 characters long; at most 256"),
    ],
)
def test_invalid_bodies_are_400(
    client: TestClient, workers: Workers, body: dict[str, Any], needle: str
) -> None:
    resp = chat(client, **{"user": "u1", **body})
    assert resp.status_code == 400, resp.text
    assert needle in message(resp)
    assert workers.seen == []


def test_not_json_and_completions_prompt(client: TestClient) -> None:
    raw = client.post("/v1/chat/completions", content=b"{nope", headers=AUTH)
    assert raw.status_code == 400 and "not valid JSON" in message(raw)
    no_prompt = client.post("/v1/completions", json={"model": "bot"}, headers=AUTH)
    assert no_prompt.status_code == 400 and "'prompt'" in message(no_prompt)
    ok = client.post("/v1/completions", json={"model": "bot", "prompt": "x"}, headers=AUTH)
    assert ok.status_code == 200


def test_body_over_limit_is_413(client: TestClient) -> None:
    resp = chat(client, user="u1", padding="x" * 5000)
    assert resp.status_code == 413
    assert "4096-byte limit" in message(resp)


def test_stream_rewrites_model_and_hides_usage_unless_asked(
    client: TestClient, workers: Workers
) -> None:
    resp = chat(client, user="u1", stream=True)
    assert resp.status_code == 200
    assert workers.seen[-1]["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }
    events = [e for e in resp.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e[6:]) for e in events[:-1]]
    assert [p["model"] for p in payloads] == ["bot", "bot"]
    assert all("usage" not in p for p in payloads)
    asked = chat(client, user="u1", stream=True, stream_options={"include_usage": True})
    last = json.loads([e for e in asked.text.split("\n\n") if e][-2][6:])
    assert last["usage"]["completion_tokens"] == 3


def test_metrics_count_requests_tokens_routing(client: TestClient) -> None:
    chat(client, user="u1")
    chat(client, user="u1", stream=True)
    chat(client, user="u2")
    text = client.get("/metrics").text
    assert 'preft_gateway_requests_total{adapter="bot",status="200"} 2.0' in text
    assert 'preft_gateway_requests_total{adapter="none",status="404"} 1.0' in text
    assert 'preft_gateway_generation_tokens_total{adapter="bot"} 6.0' in text
    assert 'preft_gateway_prompt_tokens_total{adapter="bot"} 10.0' in text
    assert 'preft_gateway_routing_total{result="preferred"} 2.0' in text
    assert 'preft_gateway_errors_total{cause="adapter_binding_not_found"} 1.0' in text
    assert 'preft_gateway_request_seconds_count{adapter="bot"} 2.0' in text
    assert 'preft_gateway_ttft_seconds_count{adapter="bot"} 1.0' in text
    assert 'preft_gateway_workers{state="healthy"} 2.0' in text


def test_adapter_label_budget() -> None:
    from preft_serve.gateway.metrics import GatewayMetrics

    metrics = GatewayMetrics(max_adapters=2)
    assert [metrics.adapter_label(n) for n in ("a", "b", "c", "a")] == ["a", "b", "other", "a"]


def test_models_lists_the_tenants_adapters_then_the_base(client: TestClient) -> None:
    resp = client.get("/v1/models", headers=AUTH)
    assert [(m["id"], m["owned_by"]) for m in resp.json()["data"]] == [
        ("bot", "acme"),
        ("tiny", "preft-serve"),
    ]
    assert client.get("/v1/models").status_code == 401


def test_healthz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


class _Redis:
    def __init__(self, up: bool) -> None:
        self.up = up

    def register_script(self, _: str) -> None:  # rate limits stay off
        return None

    async def ping(self) -> bool:
        if not self.up:
            import redis

            raise redis.ConnectionError("refused")
        return True


@pytest.mark.parametrize(
    ("redis_up", "healthy", "status", "needle"),
    [
        (True, {"w1"}, 200, None),
        (True, set(), 503, "no worker is healthy (2 known; discovery: static list of 2)"),
        (False, {"w1"}, 503, "Redis is not reachable"),
    ],
)
def test_readyz(redis_up: bool, healthy: set[str], status: int, needle: str | None) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host not in healthy:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200)

    settings = GatewaySettings(worker_urls=["http://w1:8000", "http://w2:8000"], unhealthy_after=1)
    app = create_app(
        settings,
        transport=httpx.MockTransport(handler),
        registry=FakeRegistry(),
        redis_client=_Redis(redis_up),
    )  # type: ignore[arg-type]
    with TestClient(app, raise_server_exceptions=False) as c:
        resp = c.get("/readyz")
    assert resp.status_code == status, resp.text
    if needle:
        assert needle in message(resp)
    else:
        assert resp.json() == {"status": "ready", "healthy_workers": 1, "workers": 2}
