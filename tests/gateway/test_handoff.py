"""The gateway's two-pool path against scripted workers: which requests are split, how the
two answers become one, and the fallback when no decode worker can be reached. The real
workers' side (NIXL, oracle-exact tokens) is tests/disagg."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from preft_serve.gateway.app import create_app
from preft_serve.gateway.routing import WorkerPool
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, MSGS, SHA, FakeRegistry

PREFILL, DECODE = "http://prefill:8000", "http://decode:8000"
KV = {
    "do_remote_prefill": True,
    "remote_engine_id": "e1",
    "remote_block_ids": [[1, 2]],
    "remote_host": "10.0.0.5",
    "remote_port": 5600,
    "remote_num_tokens": 4,
}


class TwoPools:
    """A prefill worker answering one token with KV params, and a decode worker (or none)."""

    def __init__(self, decode_up: bool = True, prefill_answers: bool = True) -> None:
        self.decode_up = decode_up
        self.prefill_answers = prefill_answers
        self.prefill_seen: list[dict[str, Any]] = []
        self.decode_seen: list[dict[str, Any]] = []
        self.request_ids: list[tuple[str, str | None]] = []  # (worker, X-Request-Id)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        worker = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if worker == DECODE and not self.decode_up:
            raise httpx.ConnectError("refused", request=request)
        if request.method == "GET":
            return httpx.Response(200, json={"object": "list", "data": []})
        body = json.loads(request.content)
        self.request_ids.append((worker, request.headers.get("x-request-id")))
        if worker == PREFILL:
            self.prefill_seen.append(body)
            if not self.prefill_answers:
                return httpx.Response(200, json={"object": "text_completion", "choices": []})
            return self._prefill(body, request.url.path == "/v1/chat/completions")
        self.decode_seen.append(body)
        usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        if body.get("stream"):
            chunks = [
                {
                    "id": "cmpl-d",
                    "model": body["model"],
                    "choices": [{"index": 0, "text": t, "token_ids": [i], "finish_reason": f}],
                    "usage": {**usage, "completion_tokens": n, "total_tokens": 5 + n},
                }
                for n, (t, i, f) in enumerate((("b", 11, None), ("c", 12, "length")), 1)
            ]
            chunks.append({"id": "cmpl-d", "model": body["model"], "choices": [], "usage": usage})
            text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})
        return httpx.Response(
            200,
            json={
                "id": "cmpl-d",
                "model": body["model"],
                "usage": usage,
                "choices": [
                    {
                        "index": 0,
                        "text": "bc",
                        "token_ids": [11, 12],
                        "finish_reason": "length",
                        "stop_reason": None,
                    }
                ],
            },
        )

    @staticmethod
    def _prefill(body: dict[str, Any], chat: bool) -> httpx.Response:
        usage = {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}
        whole = body.get("max_tokens") != 1  # served unified: the whole answer at once
        content = "abc" if whole else "a"
        choice: dict[str, Any] = {
            "index": 0,
            "finish_reason": "length",
            "token_ids": [10, 11, 12] if whole else [10],
        }
        if chat:
            choice["message"] = {"role": "assistant", "content": content}
        else:
            choice.update(text=content, prompt_token_ids=[1, 2, 3, 4])
        answer: dict[str, Any] = {
            "id": "chatcmpl-p",
            "created": 1,
            "model": body["model"],
            "choices": [choice],
            "usage": usage,
        }
        if chat:
            answer["prompt_token_ids"] = [1, 2, 3, 4]
        # A prefill worker's answers always carry the field: null when served whole.
        answer["kv_transfer_params"] = KV if body.get("kv_transfer_params") else None
        return httpx.Response(200, json=answer)


def client_for(workers: TwoPools) -> Iterator[TestClient]:
    settings = GatewaySettings(
        worker_urls=[PREFILL],
        decode_worker_urls=[DECODE],
        base_model_name="tiny",
        unhealthy_after=1,
    )
    app = create_app(settings, transport=httpx.MockTransport(workers), registry=FakeRegistry())
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def pools() -> TwoPools:
    return TwoPools()


@pytest.fixture
def client(pools: TwoPools) -> Iterator[TestClient]:
    yield from client_for(pools)


def metric(client: TestClient, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def test_chat_is_prefilled_then_decoded_and_answers_as_one(
    client: TestClient, pools: TwoPools
) -> None:
    reply = client.post(
        "/v1/chat/completions",
        headers=AUTH,
        json={"messages": MSGS, "user": "u1", "max_tokens": 3, "temperature": 0, "stop": ["zz"]},
    )
    assert reply.status_code == 200, reply.text
    (hop1,) = pools.prefill_seen
    assert (hop1["max_tokens"], hop1["max_completion_tokens"]) == (1, 1)
    assert hop1["kv_transfer_params"]["do_remote_decode"] is True
    assert hop1["model"] == f"sha256:{SHA}"
    (hop2,) = pools.decode_seen
    assert hop2["prompt"] == [1, 2, 3, 4, 10]  # prompt + first token
    assert hop2["max_tokens"] == 2 and hop2["kv_transfer_params"] == KV
    assert (hop2["temperature"], hop2["stop"]) == (0, ["zz"])
    assert "messages" not in hop2 and hop2["model"] == "tiny"  # the base model, no adapter
    answer = reply.json()
    assert answer["model"] == "bot" and answer["id"] == "chatcmpl-p"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "abc"}
    assert answer["usage"]["prompt_tokens"] == 4
    assert (answer["usage"]["completion_tokens"], answer["usage"]["total_tokens"]) == (3, 7)
    for hidden in ("kv_transfer_params", "prompt_token_ids"):
        assert hidden not in answer
    assert "token_ids" not in answer["choices"][0]
    assert metric(client, "preft_gateway_handoffs_total", result="decoded") == 1
    assert metric(client, "preft_gateway_generation_tokens_total", adapter="bot") == 3


def test_only_the_prefill_hop_is_routed_as_one(
    client: TestClient, pools: TwoPools, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adapter pool serves prefill hops and whole requests alike; only the short hop
    keeps a warm worker's slack at any cap (``WorkerPool.choose``), a whole request is
    routed as on a gateway without a decode pool."""
    state = client.app.state.gateway  # type: ignore[attr-defined]
    seen: list[tuple[str, bool]] = []
    choose = WorkerPool.choose

    def spy(pool: WorkerPool, key: str, prefill_hop: bool = False, classic: Any = None) -> Any:
        seen.append(("adapter" if pool is state.pool else "decode", prefill_hop))
        return choose(pool, key, prefill_hop, classic)

    monkeypatch.setattr(WorkerPool, "choose", spy)
    for extra in ({}, {"n": 2}):  # split, then served whole
        body = {"messages": MSGS, "user": "u1", "max_tokens": 3, **extra}
        reply = client.post("/v1/chat/completions", headers=AUTH, json=body)
        assert reply.status_code == 200, reply.text
    assert len(pools.decode_seen) == 1
    assert seen == [("adapter", True), ("decode", False), ("adapter", False)]


def test_streamed_text_completion_joins_both_hops(client: TestClient, pools: TwoPools) -> None:
    reply = client.post(
        "/v1/completions",
        headers=AUTH,
        json={
            "model": "bot",
            "prompt": "hi",
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert reply.status_code == 200, reply.text
    events = [
        json.loads(line[6:])
        for line in reply.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    assert reply.text.rstrip().endswith("data: [DONE]")
    assert "".join(c["text"] for e in events for c in e["choices"]) == "abc"
    assert {e["model"] for e in events} == {"bot"} and {e["id"] for e in events} == {"chatcmpl-p"}
    assert [c["finish_reason"] for e in events for c in e["choices"]][-1] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3
    assert pools.decode_seen[0]["stream"] is True


def test_both_hops_carry_the_clients_request_id(client: TestClient, pools: TwoPools) -> None:
    reply = client.post(
        "/v1/completions",
        headers={**AUTH, "X-Request-Id": "req-42"},
        json={"model": "bot", "prompt": "hi", "max_tokens": 3},
    )
    assert reply.status_code == 200 and reply.headers["x-request-id"] == "req-42"
    assert pools.request_ids == [(PREFILL, "req-42"), (DECODE, "req-42")]


@pytest.mark.parametrize(
    "stop, decoded",
    [
        (["ab"], False),
        ("zab", True),
        (["xa"], True),
        (["a"], True),
        (["b", "qa"], True),
        (["b", "a" + "z" * 255], False),  # the longest stop sequence accepted
        (["z" * 256], True),
    ],
)
def test_a_stop_string_that_may_span_both_hops_is_served_whole(
    client: TestClient, pools: TwoPools, stop: Any, decoded: bool
) -> None:
    """The first token is "a": a stop string starting with "a" could end in the decode hop,
    where the decode worker cannot see it; the prefill worker serves such a request whole."""
    reply = client.post(
        "/v1/completions",
        headers=AUTH,
        json={"model": "bot", "prompt": "hi", "max_tokens": 3, "stop": stop},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == "abc"
    assert "kv_transfer_params" not in reply.json()
    assert len(pools.decode_seen) == int(decoded)
    assert [hop["max_tokens"] for hop in pools.prefill_seen] == ([1] if decoded else [1, 3])
    assert (
        metric(client, "preft_gateway_handoffs_total", result="decoded" if decoded else "fallback")
        == 1
    )


@pytest.mark.parametrize("continuous", [True, False])
def test_a_streamed_chat_shows_running_usage_on_every_chunk_when_asked(
    client: TestClient, continuous: bool
) -> None:
    """``continuous_usage_stats``: every chunk carries the totals so far, counted across both
    hops (the prompt once, the first token as output), as one worker's stream would."""
    reply = client.post(
        "/v1/chat/completions",
        headers=AUTH,
        json={
            "messages": MSGS,
            "user": "u1",
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": continuous},
        },
    )
    assert reply.status_code == 200, reply.text
    events = [
        json.loads(line[6:])
        for line in reply.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    chunks, final = events[:-1], events[-1]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 3
    if not continuous:
        assert all("usage" not in e for e in chunks)
        return
    totals = [
        (e["usage"]["prompt_tokens"], e["usage"]["completion_tokens"], e["usage"]["total_tokens"])
        for e in chunks
    ]
    assert totals == [(4, 0, 4), (4, 1, 5), (4, 2, 6), (4, 3, 7)]


@pytest.mark.parametrize(
    "extra, reason",
    [
        ({"n": 2}, "option"),
        ({"logprobs": True, "top_logprobs": 2}, "option"),
        ({"max_tokens": 1}, "one_token"),
        ({"presence_penalty": 0.5}, "option"),
        ({"response_format": {"type": "json_object"}}, "option"),
    ],
)
def test_options_spanning_both_hops_are_served_whole(
    client: TestClient, pools: TwoPools, extra: dict[str, Any], reason: str
) -> None:
    body = {"messages": MSGS, "user": "u1", "max_tokens": 3, **extra}
    reply = client.post("/v1/chat/completions", headers=AUTH, json=body)
    assert reply.status_code == 200, reply.text
    assert pools.decode_seen == [] and "kv_transfer_params" not in pools.prefill_seen[0]
    assert metric(client, "preft_gateway_unified_total", reason=reason) == 1


def test_neutral_values_of_those_options_still_split(client: TestClient, pools: TwoPools) -> None:
    body = {
        "messages": MSGS,
        "user": "u1",
        "max_tokens": 3,
        "n": 1,
        "logprobs": False,
        "presence_penalty": 0,
    }
    assert client.post("/v1/chat/completions", headers=AUTH, json=body).status_code == 200
    assert len(pools.decode_seen) == 1


def test_no_reachable_decode_worker_serves_whole_on_the_prefill_worker() -> None:
    pools = TwoPools(decode_up=False)
    for client in client_for(pools):
        reply = client.post(
            "/v1/chat/completions",
            headers=AUTH,
            json={"messages": MSGS, "user": "u1", "max_tokens": 3},
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == "abc"
        # The prefill hop, then the same request whole on the same worker.
        assert [b["max_tokens"] for b in pools.prefill_seen] == [1, 3]
        assert "kv_transfer_params" not in pools.prefill_seen[1]
        assert metric(client, "preft_gateway_handoffs_total", result="fallback") == 1
        assert metric(client, "preft_gateway_decode_workers", state="unhealthy") == 1


def test_a_prefill_answer_without_a_choice_is_a_502() -> None:
    for client in client_for(TwoPools(prefill_answers=False)):
        reply = client.post(
            "/v1/chat/completions",
            headers=AUTH,
            json={"messages": MSGS, "user": "u1", "max_tokens": 3},
        )
        assert reply.status_code == 502, reply.text
        assert "other than a completion" in reply.json()["error"]["message"]


def test_the_prefill_hop_takes_the_tenants_cold_load_budget() -> None:
    """The prefill hop loads the adapter: it holds one of the tenant's cold-load slots
    while the prefill worker works, and gives it back after."""
    pools = TwoPools()
    held: list[int] = []
    answer = pools._prefill

    def prefill(body: dict[str, Any], chat: bool) -> httpx.Response:
        held.append(client.app.state.gateway.pool.cold.open["acme"])
        return answer(body, chat)

    pools._prefill = prefill  # type: ignore[method-assign]
    for client in client_for(pools):
        reply = client.post(
            "/v1/chat/completions",
            headers=AUTH,
            json={"messages": MSGS, "user": "u1", "max_tokens": 3},
        )
        assert reply.status_code == 200, reply.text
        assert held == [1]  # the adapter's worker has reported nothing loaded: a cold load
        assert not client.app.state.gateway.pool.cold.open["acme"]


def test_each_hop_holds_one_of_the_tenants_open_request_share() -> None:
    """The decode hop (a two-pool answer's long stream) counts against the same share as
    the prefill hop: one budget per tenant across both pools."""
    pools = TwoPools()
    held: list[tuple[str, int]] = []
    route = pools.__call__

    def counting(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            share = client.app.state.gateway.pool.tenant_open.open["acme"]
            held.append((request.url.host or "", share))
        return route(request)

    for client in client_for(counting):  # type: ignore[arg-type]
        state = client.app.state.gateway
        assert state.decode_pool.tenant_open is state.pool.tenant_open
        reply = client.post(
            "/v1/chat/completions",
            headers=AUTH,
            json={"messages": MSGS, "user": "u1", "max_tokens": 3, "stream": True},
        )
        assert reply.status_code == 200, reply.text
        hosts = [host for host, _ in held]
        assert len(pools.decode_seen) == 1 and hosts == ["prefill", "decode"]
        assert [share for _, share in held] == [1, 1]  # the prefill hop closed first
        assert not state.pool.tenant_open.open
