"""Each tenant's share of the requests a gateway keeps open to workers: past it, 429
``too_many_open_requests`` before any worker sees the request, while other tenants' pass;
the share is held while the request is open (a stream until it ends) and given back
however it ends."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from pydantic import ValidationError

from preft_serve.common.errors import ServiceUnavailable, TooManyRequests
from preft_serve.gateway.app import create_app
from preft_serve.gateway.proxy import Upstream, open_upstream
from preft_serve.gateway.routing import WorkerPool
from preft_serve.gateway.settings import GatewaySettings
from tests.gateway.test_cold_loads import LoadingWorkers
from tests.gateway.test_disconnect import EndlessStream
from tests.support.gateway import AUTH, MSGS, OTHER_KEY, FakeRegistry
from tests.support.inprocess import serve_in_thread

WORKERS = [f"http://w{i}:8000" for i in range(3)]
GUARD_S = 60
ANSWER = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


def test_a_tenants_open_requests_are_bounded_and_other_tenants_pass() -> None:
    pool = WorkerPool(WORKERS, tenant_open=2)
    calls = LoadingWorkers()

    def open_(tenant: str | None, slow: bool = False, key: str = "base") -> asyncio.Task[Upstream]:
        body = {"slow": slow}
        return asyncio.create_task(
            open_upstream(calls, pool, key, "/v1/completions", body, tenant=tenant)
        )

    async def scenario() -> None:
        waiting = [open_("t1", slow=True), open_("t1", slow=True)]
        await asyncio.sleep(0)
        assert pool.tenant_open.open["t1"] == 2
        before = pool.open_requests()
        with pytest.raises(TooManyRequests) as refused:
            await open_("t1", key="another-adapter")
        assert (refused.value.http_status, refused.value.code) == (429, "too_many_open_requests")
        assert refused.value.headers == {"Retry-After": "1"}
        assert "2 of your requests are already open on this gateway" in refused.value.message
        assert pool.open_requests() == before  # no worker was asked
        others = [await open_("t2"), await open_(None)]  # another tenant; an internal call
        calls.loaded.set()
        answered = [await task for task in waiting]
        assert pool.tenant_open.open["t1"] == 2  # held until the answers are closed
        await answered[0].aclose()
        await answered[0].aclose()  # closing twice gives back once
        assert pool.tenant_open.open["t1"] == 1
        again = await open_("t1")
        for upstream in [*answered, *others, again]:
            await upstream.aclose()
        assert not pool.tenant_open.open and pool.open_requests() == 0

    asyncio.run(asyncio.wait_for(scenario(), GUARD_S))


def test_a_request_that_is_refused_or_reaches_no_worker_gives_its_share_back() -> None:
    class Down:
        async def post(self, *args: object) -> httpx.Response:
            raise httpx.ConnectError("refused")

    pool = WorkerPool(WORKERS[:1], tenant_open=1)
    for _ in range(2):
        with pytest.raises(ServiceUnavailable, match="no worker is reachable"):
            asyncio.run(open_upstream(Down(), pool, "k", "/v1/completions", {}, tenant="t1"))
    assert not pool.tenant_open.open

    busy = WorkerPool(WORKERS[:1], max_open=1, tenant_open=1)
    busy.acquire(WORKERS[0])  # the gateway's one open request, another tenant's
    with pytest.raises(ServiceUnavailable, match="requests open to workers, its most"):
        asyncio.run(open_upstream(LoadingWorkers(), busy, "k", "/v1/completions", {}, tenant="t1"))
    assert not busy.tenant_open.open


def test_the_share_defaults_to_a_quarter_and_may_not_exceed_the_limit() -> None:
    base = {"worker_urls": ["http://w1:8000"], "base_model_name": "tiny"}
    assert GatewaySettings(**base).tenant_open_share == 250
    assert GatewaySettings(**base, max_open_requests=2).tenant_open_share == 1
    assert GatewaySettings(**base, tenant_max_open_requests=7).tenant_open_share == 7
    with pytest.raises(ValidationError, match="one tenant could hold every request slot"):
        GatewaySettings(**base, max_open_requests=10, tenant_max_open_requests=11)


def test_a_tenants_streams_hold_its_share_until_they_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the app and a real server: two streams of one tenant fill its share, its
    third request is refused before any worker sees it (and before its rate limit is
    charged), another tenant's is served, and the share comes back when a client leaves."""
    from preft_serve.gateway import completion_handler

    streams: list[EndlessStream] = []
    charged: list[str] = []
    charge = completion_handler.charge

    async def counted_charge(state, tenant, *args):  # type: ignore[no-untyped-def]
        charged.append(tenant)
        return await charge(state, tenant, *args)

    monkeypatch.setattr(completion_handler, "charge", counted_charge)

    def worker(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"data": []})
        if not json.loads(request.content).get("stream"):
            return httpx.Response(200, json=ANSWER)
        streams.append(EndlessStream())
        return httpx.Response(
            200, stream=streams[-1], headers={"content-type": "text/event-stream"}
        )

    settings = GatewaySettings(
        worker_urls=["http://w1:8000"], base_model_name="tiny", tenant_max_open_requests=2
    )
    app = create_app(settings, transport=httpx.MockTransport(worker), registry=FakeRegistry())
    server, thread, url = serve_in_thread(app)
    chat = {"messages": MSGS, "user": "u1", "stream": True}
    try:
        with (
            httpx.Client(timeout=10) as first,
            httpx.Client(timeout=10) as second,
            first.stream("POST", f"{url}/v1/chat/completions", headers=AUTH, json=chat) as a,
            second.stream("POST", f"{url}/v1/chat/completions", headers=AUTH, json=chat) as b,
        ):
            assert (a.status_code, b.status_code) == (200, 200)
            lines = a.iter_lines(), b.iter_lines()
            assert all(next(it).startswith("data: ") for it in lines)
            with httpx.stream(
                "POST", f"{url}/v1/chat/completions", headers=AUTH, json=chat, timeout=10
            ) as refused:
                assert refused.status_code == 429
                assert json.loads(refused.read())["error"]["code"] == ("too_many_open_requests")
                assert refused.headers["retry-after"] == "1"
            assert len(streams) == 2  # no worker saw it
            assert charged == ["acme", "acme"]  # nor was its rate limit charged
            other = {"messages": MSGS, "user": "u9"}
            served = httpx.post(
                f"{url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {OTHER_KEY}"},
                json={**other, "stream": False},
                timeout=10,
            )
            assert served.status_code == 200, served.text
            assert served.json()["choices"][0]["message"]["content"] == "hi"
        # both clients left: their streams end and the share comes back
        pool = app.state.gateway.pool
        deadline = time.monotonic() + 30
        while pool.tenant_open.open and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not pool.tenant_open.open
        text = httpx.get(f"{url}/metrics", timeout=10).text
        assert 'preft_gateway_errors_total{cause="too_many_open_requests"} 1.0' in text
    finally:
        server.should_exit = True
        thread.join(10)
