"""The cluster check's pure parts: the fake worker's tiers, gauges and service time, and
the comparison with the simulator. No processes start here."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from prometheus_client import generate_latest

from bench.cluster_check import (
    Row,
    compare,
    observed_moves,
    routing_in_page,
    routing_share,
    table,
    worker_ratios,
)
from bench.fake_cluster_worker import (
    MAX_MODEL_LEN,
    MODEL_PREFIX,
    Residency,
    ServiceModel,
    WorkerState,
    prompt_tokens,
)
from bench.scale_sim.model import CPU
from preft_serve.gateway.context_window import ContextWindow
from preft_serve.gateway.metrics import GatewayMetrics
from preft_serve.gateway.pool_monitor import LoadCount


def _reference_lru(uses: list[str], capacity: int) -> list[str]:
    """A list kept oldest first: remove on use, append, drop from the front."""
    held: list[str] = []
    for sha in uses:
        if sha in held:
            held.remove(sha)
        held.append(sha)
        del held[:-capacity]
    return held


def test_residency_tiers_follow_a_plain_lru() -> None:
    rng = random.Random(7)
    uses = [f"{rng.randrange(40):064x}" for _ in range(600)]
    res = Residency(max_loras=4, max_cpu_loras=12)
    for k, sha in enumerate(uses):
        earlier = uses[:k]
        expected = (
            "slot"
            if sha in _reference_lru(earlier, 4)
            else "host"
            if sha in _reference_lru(earlier, 12)
            else "disk"
            if sha in earlier
            else "fetch"
        )
        assert res.use(sha) == expected, k
    assert list(res.slots) == _reference_lru(uses, 4)
    assert list(res.host) == _reference_lru(uses, 12)
    # vLLM lists every adapter it resolved; the LRU report lists host memory only
    assert set(res.reported()) == set(uses)
    lru = Residency(4, 12, report="lru")
    for sha in uses:
        lru.use(sha)
    assert lru.reported() == _reference_lru(uses, 12)


def test_residency_prewarm_puts_the_most_popular_youngest() -> None:
    res = Residency(max_loras=2, max_cpu_loras=3)
    res.prewarm(["a", "b", "c", "d", "e"])
    assert list(res.slots) == ["b", "a"]  # oldest first
    assert list(res.host) == ["c", "b", "a"]
    assert set(res.reported()) == {"a", "b", "c", "d", "e"}
    assert [res.use(s) for s in ("a", "c", "e", "z")] == ["slot", "host", "disk", "fetch"]


def test_residency_rejects_an_unknown_report() -> None:
    with pytest.raises(ValueError, match="'resolved' or 'lru', not 'all'"):
        Residency(8, 64, report="all")


def test_gauges_read_by_the_gateways_own_parsers() -> None:
    state = WorkerState(Residency(8, 64))
    state.residency.prewarm(["ab" * 32])
    for sha in ("cd" * 32, "cd" * 32, None):
        state.admit(sha, prompt=10, output=5)
    state.finish()
    count = LoadCount()
    for line in state.metrics().splitlines():
        count.feed(line)
    assert count.requests() == 2  # three admitted, one finished
    models = state.models()
    ids = {m["id"] for m in models["data"]}
    assert ids == {"fake-base", MODEL_PREFIX + "ab" * 32, MODEL_PREFIX + "cd" * 32}
    window = ContextWindow()
    window.report("w", models)
    assert window.max_model_len == MAX_MODEL_LEN
    assert state.served == Counter({"cd" * 32: 2})
    assert state.tiers == Counter({"fetch": 1, "slot": 2})


def test_load_samples_average_the_running_count() -> None:
    state = WorkerState(Residency(8, 64))
    state.sample()
    state.admit("e" * 64, 1, 1)
    state.admit("e" * 64, 1, 1)
    state.sample()
    state.finish()
    state.sample()
    assert (state.load_sum, state.load_n) == (3.0, 3)


def test_service_time_from_the_cpu_profile() -> None:
    model = ServiceModel()
    # 100 prompt tokens, 20 output tokens, 3 running, adapter on disk:
    expected = (
        CPU.slot_copy_s
        + CPU.parse_s.p50
        + (CPU.step_base_s + 100 * CPU.token_s)
        + 20 * (CPU.step_base_s + 3 * CPU.token_s)
    )
    assert model.seconds(100, 20, 3, "disk") == pytest.approx(expected)
    assert model.seconds(100, 20, 9, "slot") > model.seconds(100, 20, 1, "slot")
    colds = [model.cold_s(t) for t in ("slot", "host", "disk", "fetch")]
    assert colds == sorted(colds) and colds[0] == 0.0
    assert colds[3] - colds[2] == pytest.approx(CPU.fetch_s.p50)


def test_prompt_tokens_of_ids_and_text() -> None:
    assert prompt_tokens({"prompt": [5] * 37}) == 37
    assert prompt_tokens({"prompt": "x" * 9}) == 3


def test_agreement_is_five_points_on_shares_ten_percent_on_ratios() -> None:
    assert Row("s", "share", 0.54, 0.50).agrees is True
    assert Row("s", "share", 0.56, 0.50).agrees is False
    assert Row("s", "share", 0.45, 0.50).agrees is True
    assert Row("r", "ratio", 1.32, 1.20).agrees is True  # +10 %
    assert Row("r", "ratio", 1.33, 1.20).agrees is False
    assert Row("r", "ratio", 1.0, None).agrees is None
    assert Row("r", "ratio", 1.3, 1.2).difference == pytest.approx(0.1 / 1.2)


def test_compare_pairs_every_metric() -> None:
    cluster = {
        "routing_share": {"resident": 0.8, "preferred": 0.05, "replica": 0.05, "spill": 0.1},
        "load_max_over_mean": 2.0,
        "requests_max_over_mean": 1.5,
        "traffic_moved": 0.02,
        "others_moved": 0.01,
    }
    sim = {
        "routing_share": {"resident": 0.7, "preferred": 0.05, "replica": 0.1, "spill": 0.15},
        "load_max_over_mean": 2.1,
        "requests_max_over_mean": 1.5,
        "others_moved": 0.0,
    }
    rows = {r.metric: r for r in compare(cluster, sim)}
    assert [rows[f"routing {r}"].agrees for r in ("resident", "preferred", "replica", "spill")] == [
        False,
        True,
        True,
        True,
    ]
    assert rows["load_max_over_mean"].agrees is True
    assert rows["traffic_moved"].agrees is None  # the simulator gave none
    text = table(list(rows.values()))
    assert "| routing resident | 80.0 % | 70.0 % | +10.0 pt | **no** |" in text
    assert "| traffic_moved | 2.0 % | - | - | - |" in text
    assert rows["others_moved"].agrees is True


def test_routing_counts_read_off_the_gateways_own_page() -> None:
    metrics = GatewayMetrics()
    for result, n in (("resident", 7), ("spill", 2), ("replica", 1)):
        for _ in range(n):
            metrics.routing.labels(result).inc()
    metrics.requests.labels("a", "200").inc()  # other series on the page are skipped
    page = generate_latest(metrics.registry)
    assert routing_in_page(page) == {"resident": 7.0, "spill": 2.0, "replica": 1.0}


def test_routing_share_counts_the_window_only() -> None:
    before = {"resident": 100.0, "spill": 10.0}
    after = {"resident": 160.0, "preferred": 20.0, "spill": 30.0}
    assert routing_share(before, after) == {
        "resident": 0.6,
        "preferred": 0.2,
        "replica": 0.0,
        "spill": 0.2,
    }


def test_worker_ratios_between_snapshots() -> None:
    before = {
        "a": {"load_sum": 10.0, "load_n": 10, "served": {"x": 5}},
        "b": {"load_sum": 0.0, "load_n": 10, "served": {}},
    }
    after = {
        "a": {"load_sum": 40.0, "load_n": 20, "served": {"x": 35}},  # load 3, 30 requests
        "b": {"load_sum": 10.0, "load_n": 20, "served": {"y": 10}},  # load 1, 10 requests
    }
    out = worker_ratios(before, after)
    assert out["load_mean"] == 2.0
    assert out["load_max_over_mean"] == 1.5
    assert out["requests_max_over_mean"] == 1.5


def test_observed_moves_count_the_leaver_and_churn_beyond_a_quiet_window() -> None:
    first = {
        "k1": Counter({"w1": 4}),
        "k2": Counter({"w2": 3, "w3": 1}),
        "k3": Counter({"w3": 2}),
    }
    second = {"k1": Counter({"w1": 2}), "k2": Counter({"w2": 2, "w4": 2}), "k3": Counter({"w3": 2})}
    after = {
        "k1": Counter({"w2": 5}),  # on the leaver before: excluded from the others
        "k2": Counter({"w2": 2, "w5": 2}),  # w5 new to k2
        "k3": Counter({"w3": 3, "w6": 1}),  # w6 new to k3
    }
    out = observed_moves(first, second, after, leaver="w1")
    assert out["traffic_moved"] == round(6 / 18, 4)  # 6 of the 18 measured ran on w1
    assert out["adapters_on_leaver"] == 1
    # quiet window: of k2, k3's 6 second-half requests, w4's 2 were new -> 1/3
    assert out["others_new_worker_no_leave"] == round(2 / 6, 4)
    # after the leave: of their 8 requests, 3 went to workers new to them -> 3/8
    assert out["others_new_worker_after"] == 0.375
    assert out["others_moved"] == round(0.375 - round(2 / 6, 4), 4)
    assert observed_moves({}, {}, {}, "w1")["traffic_moved"] is None
