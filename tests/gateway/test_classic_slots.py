"""One tenant's classic adapters (applied to every token, each keeping a worker's adapter
slot until its answer ends) hold at most ``tenant_classic_adapters_per_worker`` adapters
on one worker: past it a request goes to the next worker of its adapter's order, and
where every worker is full it gets 429 ``too_many_classic_adapters`` before any worker
sees it, while the same adapter's further requests, prefill-only adapters and other
tenants pass."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import httpx
import pytest

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.common.errors import TooManyRequests
from preft_serve.common.registry_client import AdapterRef
from preft_serve.common.tenant_xarg import TENANT_XARG
from preft_serve.gateway.app import create_app
from preft_serve.gateway.proxy import open_upstream
from preft_serve.gateway.routing import RouteResult, WorkerPool
from preft_serve.gateway.selection import adapter_target
from preft_serve.gateway.settings import GatewaySettings
from tests.gateway.test_disconnect import EndlessStream
from tests.support.gateway import AUTH, MSGS, OTHER_KEY, FakeRegistry
from tests.support.inprocess import serve_in_thread

WORKERS = [f"http://w{i}:8000" for i in range(3)]


def test_a_tenants_classic_adapters_spill_to_other_workers_then_are_refused() -> None:
    pool = WorkerPool(WORKERS, tenant_classic_adapters=1)
    held: list[tuple[str, tuple[str, str]]] = []
    for key in ("k1", "k2", "k3"):  # one per worker, whatever their favourites
        choice = pool.choose(key, classic=("acme", key))
        assert choice.classic == ("acme", key)
        assert not {w for w, _ in held} & set(choice.order)  # full workers are left out
        pool.acquire(choice.order[0], choice.classic)
        held.append((choice.order[0], ("acme", key)))
    assert len({w for w, _ in held}) == 3
    with pytest.raises(TooManyRequests) as refused:
        pool.choose("k4", classic=("acme", "k4"))
    assert (refused.value.http_status, refused.value.code) == (429, "too_many_classic_adapters")
    assert refused.value.headers == {"Retry-After": "1"}
    assert "1 of your adapters applied to every token" in refused.value.message
    assert "mode 'prefill'" in refused.value.message
    # The same adapter again needs no new slot where it is open; other tenants and
    # adapters that hold no slot through decode are not counted.
    again = pool.choose("k1", classic=("acme", "k1"))
    assert again.order == [held[0][0]]
    assert pool.choose("k4", classic=("globex", "k4")).order[0] in WORKERS
    assert len(pool.choose("k4").order) == 3
    worker, request = held.pop(1)
    pool.release(worker, request)
    assert pool.choose("k4", classic=("acme", "k4")).order == [worker]
    for worker, request in held:
        pool.release(worker, request)
    assert not pool.classic.open and pool.open_requests() == 0


def test_a_worker_that_looks_down_is_no_way_around_the_limit() -> None:
    pool = WorkerPool(WORKERS, tenant_classic_adapters=1, unhealthy_after=1)
    for worker in (WORKERS[0], WORKERS[2]):
        pool.acquire(worker, ("acme", f"held-{worker}"))
    pool.mark_failed(WORKERS[1])
    with pytest.raises(TooManyRequests):
        pool.choose("k", classic=("acme", "k"))
    pool.mark_ok(WORKERS[1])
    assert pool.choose("k", classic=("acme", "k")).order == [WORKERS[1]]


def test_a_spill_off_the_favourite_is_counted_as_one() -> None:
    pool = WorkerPool(WORKERS, tenant_classic_adapters=1)
    favourite = pool.choose("k").order[0]
    pool.acquire(favourite, ("acme", "other"))
    choice = pool.choose("k", classic=("acme", "k"))
    assert choice.preferred == favourite and choice.order[0] != favourite
    assert choice.result is RouteResult.SPILL


def test_a_request_retried_on_the_next_worker_counts_only_there() -> None:
    class FirstRefuses:
        def __init__(self) -> None:
            self.tried: list[str] = []

        async def post(self, worker: str, *args: object) -> httpx.Response:
            self.tried.append(worker)
            if len(self.tried) == 1:
                raise httpx.ConnectError("refused")
            return httpx.Response(200, json={})

    pool = WorkerPool(WORKERS, tenant_classic_adapters=1)
    calls = FirstRefuses()

    async def scenario() -> None:
        upstream = await open_upstream(
            calls, pool, "k", "/v1/completions", {}, tenant="acme", classic=("acme", "k")
        )
        assert upstream.worker == calls.tried[1]
        assert pool.classic.open == {(calls.tried[1], "acme"): {"k": 1}}
        await upstream.aclose()
        assert not pool.classic.open and pool.open_requests() == 0

    asyncio.run(scenario())


def test_only_lora_adapters_applied_to_every_token_are_classic() -> None:
    ref = FakeRegistry().ref  # a prefill-only LoRA
    assert adapter_target(ref).classic is None
    classic = dataclasses.replace(ref, mode=AdapterMode.ALL)
    target = adapter_target(classic)
    assert target.classic == ("acme", target.routing_key)
    reft = dataclasses.replace(classic, type=AdapterType.LOREFT)  # no LoRA slot
    assert adapter_target(reft).classic is None


def test_the_default_and_zero() -> None:
    base = {"worker_urls": ["http://w1:8000"], "base_model_name": "tiny"}
    assert GatewaySettings(**base).tenant_classic_adapters_per_worker == 3
    pool = WorkerPool(WORKERS[:1], tenant_classic_adapters=0)
    for key in ("k1", "k2", "k3", "k4"):
        choice = pool.choose(key, classic=("acme", key))
        pool.acquire(choice.order[0], choice.classic)
    assert pool.choose("k5", classic=("acme", "k5")).order == WORKERS[:1]


class ClassicRegistry(FakeRegistry):
    """'acme' also has classic adapters 'c1' and 'c2'; 'globex' has classic 'g1'."""

    def __init__(self) -> None:
        super().__init__()
        self.classic = {
            ("acme", name): self._classic("acme", name, seed)
            for seed, name in enumerate(("c1", "c2"))
        }
        self.classic[("globex", "g1")] = self._classic("globex", "g1", 2)

    @staticmethod
    def _classic(tenant: str, name: str, seed: int) -> AdapterRef:
        return AdapterRef(
            tenant, name, 1, f"{seed:02x}" * 32, AdapterType.LORA, AdapterMode.ALL, 8, "m"
        )

    async def resolve_adapter(self, tenant: str, name: str) -> AdapterRef | None:
        found = self.classic.get((tenant, name))
        return found or await super().resolve_adapter(tenant, name)


def test_through_the_app_a_tenants_long_answer_holds_its_classic_slot() -> None:
    streams: list[EndlessStream] = []
    seen: list[str] = []
    xargs: dict[str, object] = {}  # model -> the vllm_xargs the worker got

    def worker(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"data": []})
        body = json.loads(request.content)
        seen.append(body["model"])
        xargs[body["model"]] = body.get("vllm_xargs")
        if not body.get("stream"):
            return httpx.Response(
                200,
                json={
                    "model": body["model"],
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                },
            )
        streams.append(EndlessStream())
        return httpx.Response(
            200, stream=streams[-1], headers={"content-type": "text/event-stream"}
        )

    settings = GatewaySettings(
        worker_urls=["http://w1:8000"], base_model_name="tiny", tenant_classic_adapters_per_worker=1
    )
    registry = ClassicRegistry()
    app = create_app(settings, transport=httpx.MockTransport(worker), registry=registry)
    server, thread, url = serve_in_thread(app)
    endpoint = f"{url}/v1/chat/completions"

    def ask(model: str, headers: dict[str, str] = AUTH) -> httpx.Response:
        body = {"messages": MSGS, "model": model, "stream": False}
        return httpx.post(endpoint, headers=headers, json=body, timeout=10)

    try:
        long_answer = {"messages": MSGS, "model": "c1", "stream": True}
        with (
            httpx.Client(timeout=10) as client,
            client.stream("POST", endpoint, headers=AUTH, json=long_answer) as held,
        ):
            assert held.status_code == 200
            lines = held.iter_lines()  # kept: a dropped iterator would close the stream
            assert next(lines).startswith("data: ")
            before = len(seen)
            refused = ask("c2")
            assert refused.status_code == 429, refused.text
            error = refused.json()["error"]
            assert error["code"] == "too_many_classic_adapters"
            assert "mode 'prefill'" in error["message"]
            assert refused.headers["retry-after"] == "1"
            assert len(seen) == before  # no worker saw it
            # The open adapter, a prefill-only one and another tenant's classic one pass.
            assert ask("c1").status_code == 200
            assert ask("bot").status_code == 200
            other = ask("g1", {"Authorization": f"Bearer {OTHER_KEY}"})
            assert other.status_code == 200, other.text
        pool = app.state.gateway.pool
        deadline = time.monotonic() + 30
        while pool.classic.open and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not pool.classic.open  # the client left: its slot came back
        assert ask("c2").status_code == 200
        # The worker is told whose classic adapter it runs (it bounds each tenant's slots).
        classic = {"c1": "acme", "c2": "acme", "g1": "globex"}
        for name, tenant in classic.items():
            ref = registry.classic[(tenant, name)]
            assert ref.mode is AdapterMode.ALL
            assert xargs[f"sha256:{ref.sha256}"] == {TENANT_XARG: tenant}
        assert xargs[f"sha256:{registry.ref.sha256}"] is None  # prefill-only: not needed
        forged = httpx.post(
            endpoint,
            headers=AUTH,
            json={"messages": MSGS, "model": "c2", "vllm_xargs": {TENANT_XARG: "globex"}},
            timeout=10,
        )
        assert forged.status_code == 400
        assert forged.json()["error"]["param"] == f"vllm_xargs.{TENANT_XARG}"
        text = httpx.get(f"{url}/metrics", timeout=10).text
        assert 'preft_gateway_errors_total{cause="too_many_classic_adapters"} 1.0' in text
    finally:
        server.should_exit = True
        thread.join(10)
