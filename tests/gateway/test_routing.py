"""Routing: rendezvous order, the bounded-load cap, and retry on connection failure."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest
from preft_serve.common.errors import ServiceUnavailable
from preft_serve.gateway.proxy import open_upstream
from preft_serve.gateway.routing import WorkerPool, rendezvous_order

WORKERS = [f"http://w{i}:8000" for i in range(4)]


def test_rendezvous_is_stable_and_spreads_keys() -> None:
    keys = [f"{i:064x}" for i in range(400)]
    first = {k: rendezvous_order(k, WORKERS)[0] for k in keys}
    assert first == {k: rendezvous_order(k, list(reversed(WORKERS)))[0] for k in keys}
    assert all(sorted(rendezvous_order(k, WORKERS)) == sorted(WORKERS) for k in keys[:10])
    counts = Counter(first.values())
    assert len(counts) == 4 and min(counts.values()) > 60  # roughly uniform


def test_removing_a_worker_only_moves_its_keys() -> None:
    keys = [f"{i:064x}" for i in range(300)]
    before = {k: rendezvous_order(k, WORKERS)[0] for k in keys}
    after = {k: rendezvous_order(k, WORKERS[:3])[0] for k in keys}
    moved = {k for k in keys if before[k] != after[k]}
    assert moved == {k for k in keys if before[k] == WORKERS[3]}


def test_choice_is_affinity_under_the_cap_and_spills_over_it() -> None:
    pool = WorkerPool(WORKERS)
    key = "ab" * 32
    top = rendezvous_order(key, WORKERS)
    choice = pool.choose(key)
    assert (choice.order, choice.spilled) == (top, False)
    # Load the favourite up to the cap: ceil(avg * 1.25) + 1 with avg counting this request.
    while pool.inflight[top[0]] < pool.cap():
        pool.acquire(top[0])
    # With 2 in flight: avg (2+1)/4 = 0.75 -> cap ceil(0.9375) + 1 = 2.
    assert pool.inflight[top[0]] == pool.cap() == 2
    spilled = pool.choose(key)
    assert spilled.spilled and spilled.order[0] == top[1] and spilled.preferred == top[0]
    assert sorted(spilled.order) == sorted(WORKERS)
    pool.release(top[0])
    assert not pool.choose(key).spilled


def test_track_releases_on_error() -> None:
    pool = WorkerPool(WORKERS[:1])
    with pytest.raises(RuntimeError), pool.track(WORKERS[0]):
        assert pool.inflight[WORKERS[0]] == 1
        raise RuntimeError
    assert pool.inflight[WORKERS[0]] == 0


def _send(handler: httpx.MockTransport, pool: WorkerPool, key: str) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=handler) as client:
            upstream = await open_upstream(client, pool, key, "/v1/completions", {"x": 1})
            await upstream.response.aread()
            assert pool.inflight[upstream.worker] == 1
            await upstream.aclose()
            upstream.response.extensions["worker"] = upstream.worker
            return upstream.response

    return asyncio.run(go())


def test_connect_failure_retries_on_the_next_worker() -> None:
    key = "cd" * 32
    order = rendezvous_order(key, WORKERS)
    tried: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        origin = f"http://{request.url.host}:8000"
        tried.append(origin)
        if origin in order[:2]:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"ok": True})

    pool = WorkerPool(WORKERS)
    response = _send(httpx.MockTransport(handler), pool, key)
    assert tried == order[:3]
    assert response.extensions["worker"] == order[2]
    assert set(pool.inflight.values()) == {0}


def test_all_workers_down_is_503_and_releases_slots() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    pool = WorkerPool(WORKERS)
    with pytest.raises(ServiceUnavailable, match="no worker is reachable"):
        _send(httpx.MockTransport(handler), pool, "k")
    assert set(pool.inflight.values()) == {0}


def test_read_failure_is_not_retried() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        raise httpx.ReadTimeout("slow", request=request)

    pool = WorkerPool(WORKERS)
    with pytest.raises(Exception, match="failed: ReadTimeout"):
        _send(httpx.MockTransport(handler), pool, "k")
    assert len(calls) == 1 and set(pool.inflight.values()) == {0}
