"""Routing: rendezvous order, the bounded-load cap, and retry on connection failure."""

from __future__ import annotations

import asyncio
import math
from collections import Counter

import httpx
import pytest

from preft_serve.common.errors import ServiceUnavailable
from preft_serve.gateway.proxy import open_upstream, take_route
from preft_serve.gateway.routing import (
    RouteResult,
    WorkerPool,
    pool_from_settings,
    rendezvous_order,
)
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.gateway.upstream import WorkerCalls

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
        calls = WorkerCalls(handler, httpx.Timeout(5.0))
        upstream = await open_upstream(calls, pool, key, "/v1/completions", {"x": 1})
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


def test_a_timed_out_connect_is_tried_again_after_every_worker() -> None:
    """A stalled gateway loop times out connects to workers that accept: when every
    worker failed, the timed-out ones get one more try; refused ones none."""
    key = "ef" * 32
    order = rendezvous_order(key, WORKERS)
    tried: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        origin = f"http://{request.url.host}:8000"
        tried.append(origin)
        if origin == order[1] and tried.count(origin) == 1:
            raise httpx.ConnectTimeout("timed out", request=request)
        if origin != order[1]:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"ok": True})

    pool = WorkerPool(WORKERS)
    response = _send(httpx.MockTransport(handler), pool, key)
    assert tried == [*order, order[1]]
    assert response.extensions["worker"] == order[1]
    assert set(pool.inflight.values()) == {0}


def test_a_connect_that_times_out_twice_is_503_naming_both_tries() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=request)

    pool = WorkerPool(WORKERS[:1])
    with pytest.raises(ServiceUnavailable) as raised:
        _send(httpx.MockTransport(handler), pool, "k")
    tries = f"{WORKERS[0]}: ConnectTimeout; {WORKERS[0]} (again): ConnectTimeout"
    assert tries in raised.value.message
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


def test_unhealthy_workers_get_no_requests_until_they_recover() -> None:
    pool = WorkerPool(WORKERS, unhealthy_after=2)
    key = "ef" * 32
    top = rendezvous_order(key, WORKERS)
    pool.mark_failed(top[0])
    assert pool.choose(key).order[0] == top[0]  # one failure is not enough
    pool.mark_failed(top[0])
    choice = pool.choose(key)
    assert choice.order[0] == top[1] and choice.order[-1] == top[0]  # last-resort retry
    assert choice.preferred == top[1] and choice.result is RouteResult.PREFERRED
    pool.mark_ok(top[0])
    assert pool.choose(key).order[0] == top[0]
    for worker in WORKERS:  # everyone down: try them all rather than refuse
        pool.mark_failed(worker)
        pool.mark_failed(worker)
    assert pool.choose(key).order == top


def test_a_worker_with_the_adapter_resident_wins_under_the_cap() -> None:
    pool = WorkerPool(WORKERS)
    key = "12" * 32
    top = rendezvous_order(key, WORKERS)
    pool.set_resident(top[2], frozenset({key}))
    choice = pool.choose(key)
    assert choice.order[0] == top[2] and choice.result is RouteResult.RESIDENT
    assert choice.preferred == top[0]
    pool.set_resident(top[0], frozenset({key}))
    assert pool.choose(key).order[0] == top[0]  # both warm: rendezvous order decides
    while pool.inflight[top[0]] < pool.cap():
        pool.acquire(top[0])
    over = pool.choose(key)
    assert over.order[0] == top[2] and over.result is RouteResult.RESIDENT


def test_a_warm_worker_one_past_the_cap_takes_the_key_before_a_cold_spill() -> None:
    # Every worker holds 8 requests (the workers' own gauges); the favourite has the key.
    key = "56" * 32
    top = rendezvous_order(key, WORKERS)
    pool = WorkerPool(WORKERS, worker_load=True)
    for worker in WORKERS:
        pool.set_worker_load(worker, 8)
    pool.set_resident(top[0], frozenset({key}))
    pool.set_worker_load(top[0], 12)  # at the cap: ceil((36 + 1) / 4 x 1.25) = 12
    assert pool.cap() == 12
    choice = pool.choose(key)
    assert (choice.order[0], choice.result) == (top[0], RouteResult.RESIDENT)
    strict = WorkerPool(WORKERS, worker_load=True, resident_slack=0)
    for worker in WORKERS:
        strict.set_worker_load(worker, 12 if worker == top[0] else 8)
    strict.set_resident(top[0], frozenset({key}))
    assert strict.choose(key).order[0] == top[1]  # no slack: a cold spill at the cap
    pool.set_worker_load(top[0], 13)  # one past the cap (ceil(38 / 4 x 1.25) = 12)
    assert pool.cap() == 12
    spilled = pool.choose(key)
    assert (spilled.order[0], spilled.result) == (top[1], RouteResult.SPILL)
    # A worker under the cap that has the key comes before the favourite past it.
    pool.set_worker_load(top[0], 12)
    pool.set_resident(top[2], frozenset({key}))
    assert pool.choose(key).order[0] == top[2]


def test_the_slack_is_for_warm_workers_only_and_bounds_their_load() -> None:
    # A cold key spills at the cap as before; a warm one fills its favourite to cap + 1
    # and no further, whatever this gateway sends (no poll in between).
    key = "78" * 32
    top = rendezvous_order(key, WORKERS)
    pool = WorkerPool(WORKERS, worker_load=True)
    for worker in WORKERS:
        pool.set_worker_load(worker, 8)  # cap ceil(33 / 4 x 1.25) = 11: headroom for one
    while pool.status[top[0]].load < pool.cap():
        pool.acquire(top[0])
    assert pool.choose(key).spilled
    pool.set_resident(top[0], frozenset({key}))
    assert pool.choose(key).order[0] == top[0]  # warm, at the cap: it takes one more
    spills = 0
    for _ in range(40):
        cap, load = pool.cap(), pool.status[top[0]].load
        first = pool.choose(key).order[0]
        assert (first == top[0]) == (load < cap + 1)  # spills only past cap + 1
        spills += first != top[0]
        pool.acquire(first)
    assert spills == sum(pool.inflight[w] for w in top[1:]) > 0


def test_no_slack_where_the_cap_is_too_small_to_hold_it() -> None:
    # This gateway's own counts, two requests on the favourite: the cap is
    # ceil(3 / 4 x 1.25) + 1 = 2, and 2 x 0.25 leaves no room for a request past it.
    key = "9a" * 32
    top = rendezvous_order(key, WORKERS)
    pool = WorkerPool(WORKERS)
    pool.set_resident(top[0], frozenset({key}))
    pool.acquire(top[0])
    pool.acquire(top[0])
    assert pool.cap() == 2
    choice = pool.choose(key)
    assert (choice.order[0], choice.result) == (top[1], RouteResult.SPILL)


def test_a_prefill_hop_keeps_the_slack_at_any_cap() -> None:
    # The workers' own loads: the warm favourite at 3 of 8 in all, so the cap is
    # ceil(9 / 4 x 1.25) = 3, too small for the slack of a whole request; a two-pool
    # gateway's prefill hop goes to the warm worker once more, and spills past cap + 1.
    key = "9a" * 32
    top = rendezvous_order(key, WORKERS)
    pool = WorkerPool(WORKERS, worker_load=True)
    pool.set_resident(top[0], frozenset({key}))
    for worker, load in zip(top, (3, 2, 2, 1), strict=True):
        pool.set_worker_load(worker, load)
    assert pool.cap() == 3
    whole, hop = pool.choose(key), pool.choose(key, prefill_hop=True)
    assert (whole.order[0], whole.result) == (top[1], RouteResult.SPILL)
    assert (hop.order[0], hop.result) == (top[0], RouteResult.RESIDENT)
    # take_route, the decision open_upstream and the scale simulator share, passes it on.
    assert take_route(pool, key, prefill_hop=True).choice.order[0] == top[0]
    assert take_route(pool, key).choice.order[0] == top[1]
    for worker, load in zip(top, (4, 2, 1, 1), strict=True):
        pool.set_worker_load(worker, load)
    assert pool.cap() == 3
    assert pool.choose(key, prefill_hop=True).result == RouteResult.SPILL


def test_on_worker_load_the_cap_counts_other_gateways_requests() -> None:
    # Ten gateways, each with one request on each of four workers: alone, a gateway's cap
    # is ceil(5/4 x 1.25) + 1 = 3, so all ten could put 20 more on one hot worker.
    key = "34" * 32
    top = rendezvous_order(key, WORKERS)
    mine = WorkerPool(WORKERS)
    for worker in WORKERS:
        mine.acquire(worker)
    assert mine.cap() == 3
    cluster = WorkerPool(WORKERS, worker_load=True)
    for worker in WORKERS:
        cluster.acquire(worker)
        cluster.set_worker_load(worker, 10)  # the worker's running + waiting, all gateways
    assert cluster.status[top[0]].others == 9
    assert cluster.cap() == math.ceil(41 / 4 * 1.25)  # 13: the cluster's mean, no slack
    for _ in range(5):  # this gateway's own requests move the load between polls
        assert cluster.choose(key).order[0] == top[0]
        cluster.acquire(top[0])
    assert cluster.status[top[0]].load == cluster.cap() == 15  # ceil(46 / 4 x 1.25)
    assert cluster.choose(key).spilled
    cluster.release(top[0])
    assert not cluster.choose(key).spilled


def test_worker_load_counts_the_others_share_only() -> None:
    pool = WorkerPool(WORKERS[:2], worker_load=True)
    for _ in range(5):
        pool.acquire(WORKERS[0])
    pool.set_worker_load(WORKERS[0], 3)  # vLLM has not seen all of ours yet: no others
    assert (pool.status[WORKERS[0]].others, pool.status[WORKERS[0]].load) == (0, 5)
    pool.set_worker_load("http://gone:8000", 7)  # a worker discovery dropped: ignored
    off = WorkerPool(WORKERS[:2])
    off.set_worker_load(WORKERS[0], 50)  # the setting off: the count is not used
    assert off.status[WORKERS[0]].load == 0 and off.cap() == 2


def test_membership_changes_keep_state_and_forget_removed_workers() -> None:
    pool = WorkerPool(WORKERS[:2])
    pool.acquire(WORKERS[0])
    added, removed = pool.set_workers(WORKERS[1:3])
    assert (added, removed) == ([WORKERS[2]], [WORKERS[0]])
    pool.release(WORKERS[0])  # a request finishing on a removed worker is harmless
    assert pool.inflight == {WORKERS[1]: 0, WORKERS[2]: 0}
    pool.set_workers([])
    with pytest.raises(ServiceUnavailable, match="no worker is registered yet"):
        pool.choose("k")


def test_connect_failures_mark_the_worker_unhealthy() -> None:
    key = "34" * 32
    order = rendezvous_order(key, WORKERS)

    def handler(request: httpx.Request) -> httpx.Response:
        if f"http://{request.url.host}:8000" == order[0]:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"ok": True})

    pool = WorkerPool(WORKERS, unhealthy_after=2)
    assert _send(httpx.MockTransport(handler), pool, key).extensions["worker"] == order[1]
    assert pool.is_healthy(order[0])
    _send(httpx.MockTransport(handler), pool, key)
    assert not pool.is_healthy(order[0]) and pool.choose(key).order[0] == order[1]


def test_choice_follows_membership_changes_for_a_key_seen_before() -> None:
    """The rendezvous order is remembered per key and membership: a worker that joins or
    leaves changes the order at once."""
    key = "ab" * 32
    pool = WorkerPool(WORKERS[:2])
    assert pool.choose(key).order == rendezvous_order(key, WORKERS[:2])
    pool.set_workers(WORKERS)
    assert pool.choose(key).order == rendezvous_order(key, WORKERS)
    favourite = rendezvous_order(key, WORKERS)[0]
    rest = [w for w in WORKERS if w != favourite]
    pool.set_workers(rest)
    assert pool.choose(key).order == rendezvous_order(key, rest)


def test_a_worker_back_from_removal_still_counts_its_open_requests() -> None:
    """Discovery drops a worker (a readiness flap) and brings it back while two of its
    requests are open: its count must stay right, never negative, when they end."""
    pool = WorkerPool(WORKERS[:2])
    pool.acquire(WORKERS[0])
    pool.acquire(WORKERS[0])
    pool.set_workers(WORKERS[1:2])
    pool.release(WORKERS[0])  # one ends while the worker is out
    pool.set_workers(WORKERS[:2])
    assert pool.inflight[WORKERS[0]] == 1
    pool.release(WORKERS[0])
    assert pool.inflight == {WORKERS[0]: 0, WORKERS[1]: 0}
    pool.set_workers(WORKERS[1:2])  # removed with nothing open: forgotten
    pool.set_workers(WORKERS[:2])
    assert pool.inflight[WORKERS[0]] == 0


def test_past_its_open_request_limit_the_gateway_refuses_instead_of_queueing() -> None:
    """Waiting in the connection pool would end in a timeout that reads as the worker
    failing to connect (retried elsewhere, counted against its health): refuse at once."""
    pool = WorkerPool(WORKERS[:2], max_open=2)
    first = pool.choose("a").order[0]
    pool.acquire(first)
    pool.acquire(pool.choose("b").order[0])
    with pytest.raises(ServiceUnavailable, match="2 requests open to workers, its most"):
        pool.choose("c")
    assert all(pool.is_healthy(w) for w in WORKERS[:2])  # nobody's health paid for it
    pool.release(first)
    assert pool.choose("c").order
    pool.acquire(first)
    pool.set_workers(WORKERS[1:2])  # a removed worker's open requests still count
    with pytest.raises(ServiceUnavailable):
        pool.choose("c")


MANY = [f"http://w{i}:8000" for i in range(20)]
HOT = "ff" * 32


def drive(
    pool: WorkerPool, requests: int, hot_every: int, open_for: int = 40
) -> dict[str, Counter[str]]:
    """``requests`` requests, every ``hot_every``-th for ``HOT`` and the rest each for a new
    key; each stays in flight for the next ``open_for`` requests. The workers each key's
    requests went to, over the second half."""
    where: dict[str, Counter[str]] = {"hot": Counter(), "cold": Counter()}
    open_: list[str] = []
    for i in range(requests):
        key = HOT if i % hot_every == 0 else f"{i:064x}"
        worker = pool.choose(key).order[0]
        pool.acquire(worker)
        open_.append(worker)
        if len(open_) > open_for:
            pool.release(open_.pop(0))
        if i >= requests // 2:
            where["hot" if key == HOT else "cold"][worker] += 1
    return where


def test_a_hot_key_is_spread_evenly_over_the_first_k_of_its_order() -> None:
    # A 1/12 share on 20 workers at load factor 1.25: ceil(0.083 x 20 / 0.25) = 7 replicas.
    pool = WorkerPool(MANY, hot_replicas=16, hot_window=1000)
    hot = drive(pool, 8000, hot_every=12)["hot"]
    assert pool.replicas(HOT, len(MANY)) == 7
    top = rendezvous_order(HOT, MANY)
    assert set(hot) == set(top[:7])
    mean = sum(hot.values()) / 7
    assert max(hot.values()) < 1.3 * mean and min(hot.values()) > 0.7 * mean
    # hot_replicas bounds k.
    capped = WorkerPool(MANY, hot_replicas=3, hot_window=1000)
    assert set(drive(capped, 4000, hot_every=12)["hot"]) == set(top[:3])


def test_hot_headroom_of_its_own_spreads_a_hot_key_wider_than_the_caps() -> None:
    pool = WorkerPool(MANY, hot_replicas=32, hot_window=1000, hot_headroom=0.1)
    drive(pool, 4000, hot_every=12)
    share = pool.hot.share(HOT) if pool.hot else 0.0
    # The next request counts too: its share then is a hair above the one read here.
    assert pool.replicas(HOT, len(MANY)) == math.ceil(pool.hot.share(HOT) * 20 / 0.1 - 1e-9)
    assert pool.replicas(HOT, len(MANY)) > math.ceil(share * 20 / 0.25)  # the cap's headroom


def test_the_pool_from_settings_is_the_one_the_settings_describe() -> None:
    settings = GatewaySettings.model_construct()
    pool = pool_from_settings(settings, WORKERS)
    assert pool.workers == WORKERS and pool.worker_load is settings.cap_on_worker_load
    assert (pool.load_factor, pool.max_open, pool.hot_replicas, pool.hot_headroom) == (
        settings.load_factor,
        settings.max_open_requests,
        settings.hot_replicas,
        settings.hot_headroom,
    )
    assert pool.cold.limit == settings.tenant_cold_loads
    decode = pool_from_settings(settings, WORKERS, decode=True)
    assert decode.hot is None and decode.max_open is None


def test_a_hot_keys_replica_prefers_resident_workers_and_says_why() -> None:
    pool = WorkerPool(MANY, hot_replicas=8, hot_window=100)
    top = rendezvous_order(HOT, MANY)
    for _ in range(100):
        pool.choose(HOT)  # the whole window: k = 8
    results = Counter()
    for _ in range(16):
        choice = pool.choose(HOT)
        assert choice.preferred == top[0] and choice.order[0] in top[:8]
        results[choice.result] += 1
        pool.acquire(choice.order[0])
    assert results[RouteResult.REPLICA] == 14 and results[RouteResult.PREFERRED] == 2
    assert not any(pool.choose(HOT).spilled for _ in range(3))
    pool.set_resident(top[5], frozenset({HOT}))
    choice = pool.choose(HOT)
    assert (choice.order[0], choice.result) == (top[5], RouteResult.RESIDENT)


def test_cold_keys_route_as_without_hot_replicas() -> None:
    on = WorkerPool(MANY, hot_replicas=16, hot_window=1000)
    off = WorkerPool(MANY)
    drive(on, 2000, hot_every=10)
    for w in MANY:  # the same in-flight counts on both, whatever the hot key left
        off.status[w].inflight = on.status[w].inflight
    for i in range(300):
        key = f"{i:032x}"
        assert on.replicas(key, len(MANY)) == 1
        assert on.choose(key) == off.choose(key)
    assert off.hot is None  # off: nothing is counted


def test_membership_changes_move_a_hot_keys_replicas_as_little_as_its_favourite() -> None:
    keys = [f"{i:064x}" for i in range(200)]
    k = 4
    for gone in MANY[:5]:
        after_workers = [w for w in MANY if w != gone]
        for key in keys:
            before = rendezvous_order(key, MANY)
            after = rendezvous_order(key, after_workers)
            # The replicas are a prefix: losing one of them brings in the next in line,
            # losing any other worker changes nothing.
            expected = [w for w in before[: k + 1] if w != gone][:k]
            assert after[:k] == expected
    # And the pool's choices for a hot key stay on that prefix after the change.
    pool = WorkerPool(MANY, hot_replicas=k, hot_window=100)
    top = rendezvous_order(HOT, MANY)
    pool.set_workers([w for w in MANY if w != top[1]])
    chosen = set()
    for _ in range(200):
        worker = pool.choose(HOT).order[0]
        chosen.add(worker)
        pool.acquire(worker)
        pool.release(worker)
    assert chosen == {top[0], top[2], top[3], top[4]}
