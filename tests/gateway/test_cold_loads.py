"""The per-tenant cold-load budget: a tenant's requests waiting on workers that have not
loaded their adapter are bounded; its warm requests and other tenants' pass."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from preft_serve.common.errors import TooManyRequests
from preft_serve.common.registry_client import AdapterRef
from preft_serve.common.registry_client.contract import AdapterMode, AdapterType
from preft_serve.gateway.proxy import Upstream, open_upstream
from preft_serve.gateway.routing import WorkerPool, rendezvous_order
from preft_serve.gateway.selection import Target, adapter_target
from preft_serve.gateway.settings import GatewaySettings

WORKERS = [f"http://w{i}:8000" for i in range(3)]
COLD, WARM, OTHER = "a" * 64, "b" * 64, "c" * 64
GUARD_S = 60  # a request left waiting on a load that never ends fails, not hangs, the run


class LoadingWorkers:
    """Workers that answer a request only when the test lets its adapter finish loading
    (as vLLM sends a stream's headers once the adapter is loaded)."""

    def __init__(self) -> None:
        self.loaded = asyncio.Event()

    async def post(
        self, worker: str, path: str, content: bytes, headers: dict[str, str]
    ) -> httpx.Response:
        if b'"slow":true' in content:
            await self.loaded.wait()
        return httpx.Response(200, json={})


def test_a_tenants_cold_requests_are_bounded_and_nothing_else_is() -> None:
    pool = WorkerPool(WORKERS, tenant_cold_loads=2)
    pool.set_resident(rendezvous_order(WARM, WORKERS)[0], frozenset({WARM}))
    calls = LoadingWorkers()

    def open_(key: str, tenant: str | None, slow: bool = False) -> asyncio.Task[Upstream]:
        return asyncio.create_task(
            open_upstream(calls, pool, key, "/v1/completions", {"slow": slow}, cold_tenant=tenant)
        )

    async def scenario() -> None:
        loading = [open_(COLD, "t1", slow=True), open_(COLD, "t1", slow=True)]
        await asyncio.sleep(0)
        assert pool.cold.open["t1"] == 2
        before = pool.open_requests()
        with pytest.raises(TooManyRequests) as refused:
            await open_(COLD, "t1")
        assert refused.value.http_status == 429
        assert refused.value.code == "too_many_cold_loads"
        assert "retry shortly" in refused.value.message
        assert pool.open_requests() == before and pool.cold.open["t1"] == 2  # unchanged
        passed = [
            await open_(WARM, "t1"),  # loaded on its worker: not a cold load
            await open_(OTHER, "t2"),  # another tenant's budget
            await open_("base", None),
        ]  # the base model: no budget
        calls.loaded.set()  # the loads finish: the workers answer, the slots are free
        passed += [await task for task in loading]
        assert not pool.cold.open
        passed.append(await open_(COLD, "t1"))
        for upstream in passed:
            await upstream.aclose()
        assert pool.open_requests() == 0

    asyncio.run(asyncio.wait_for(scenario(), GUARD_S))


def test_a_request_that_fails_to_reach_any_worker_gives_its_slot_back() -> None:
    pool = WorkerPool(WORKERS[:1], tenant_cold_loads=1)

    class Down:
        async def post(
            self, worker: str, path: str, content: bytes, headers: dict[str, str]
        ) -> httpx.Response:
            raise httpx.ConnectError("refused")

    for _ in range(2):
        with pytest.raises(Exception, match="no worker is reachable"):
            asyncio.run(open_upstream(Down(), pool, COLD, "/v1/completions", {}, cold_tenant="t1"))
    assert not pool.cold.open


def test_no_limit_at_zero_and_a_limit_by_default() -> None:
    pool = WorkerPool(WORKERS)
    calls = LoadingWorkers()

    async def many() -> int:
        tasks = [
            asyncio.create_task(
                open_upstream(
                    calls, pool, COLD, "/v1/completions", {"slow": True}, cold_tenant="t1"
                )
            )
            for _ in range(50)
        ]
        await asyncio.sleep(0)
        waiting = pool.cold.open["t1"]
        calls.loaded.set()
        await asyncio.gather(*tasks)
        return waiting

    assert asyncio.run(asyncio.wait_for(many(), GUARD_S)) == 50
    assert GatewaySettings.model_construct().tenant_cold_loads > 0


def test_the_target_of_an_adapter_names_its_tenant_and_the_base_model_none() -> None:
    assert Target("base", "base", "base").cold_tenant is None
    ref = AdapterRef("t7", "a", 1, COLD, AdapterType.LORA, AdapterMode.PREFILL, 16, "base")
    assert adapter_target(ref).cold_tenant == "t7"
