"""A hot adapter is spread over its first k rendezvous workers while a cold one stays on its
favourite: the app behind real loopback HTTP, eight MockTransport workers."""

from __future__ import annotations

import json
from collections import Counter

import httpx

from preft_serve.gateway.app import create_app
from preft_serve.gateway.hot_keys import HotKeys
from preft_serve.gateway.routing import rendezvous_order
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, MSGS, OTHER_KEY, SHA, FakeRegistry
from tests.support.inprocess import serving

WORKERS = [f"http://w{i}:8000" for i in range(8)]
COLD_SHA = "cd" * 32  # FakeRegistry's 'rival', bound to globex's user u9


def test_a_hot_adapter_is_spread_over_k_workers_and_a_cold_one_is_not() -> None:
    seen: Counter[tuple[str, str]] = Counter()

    def worker(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"object": "list", "data": []})
        body = request.content.decode()
        sha = SHA if SHA in body else COLD_SHA if COLD_SHA in body else "?"
        seen[(sha, f"http://{request.url.host}:8000")] += 1
        model = json.loads(body)["model"]
        return httpx.Response(
            200,
            json={
                "model": model,
                "choices": [{"message": {"content": "hi"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )

    # A hot headroom of 2 means: with 90% of the requests on 8 workers 'bot' gets
    # ceil(0.9 x 8 / 2) = 4 replicas, 'rival' (10%) stays at 1.
    settings = GatewaySettings(
        worker_urls=WORKERS,
        base_model_name="tiny",
        load_factor=3.0,
        hot_replicas=6,
        hot_headroom=2.0,
    )
    app = create_app(settings, transport=httpx.MockTransport(worker), registry=FakeRegistry())
    cold_auth = {"Authorization": f"Bearer {OTHER_KEY}"}
    with serving(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        pool = app.state.gateway.pool
        pool.hot = HotKeys(window=50)  # the default window (4096) would need more requests
        for i in range(300):
            hot = i % 10 != 0
            r = client.post(
                "/v1/chat/completions",
                headers=AUTH if hot else cold_auth,
                json={"messages": MSGS, "user": "u1" if hot else "u9"},
            )
            assert r.status_code == 200, r.text
            if i == 99:
                seen.clear()  # past the tracker's warm-up
        routing = client.get("/metrics").text
    hot = {w: n for (sha, w), n in seen.items() if sha == SHA}
    cold = {w: n for (sha, w), n in seen.items() if sha == COLD_SHA}
    assert sum(hot.values()) == 180 and sum(cold.values()) == 20
    assert set(hot) == set(rendezvous_order(SHA, WORKERS)[:4])
    assert min(hot.values()) >= 180 / 4 * 0.7  # one gateway, one request at a time: in turn
    assert set(cold) == {rendezvous_order(COLD_SHA, WORKERS)[0]}
    assert 'preft_gateway_routing_total{result="replica"}' in routing
