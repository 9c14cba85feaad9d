"""The scale simulator keeps its invariants, routes with the product's own code, and agrees
with a recorded load test. Small configurations only (the whole file runs in well under a
minute): the default run's numbers are in docs/scale.md."""

from __future__ import annotations

import hashlib
import inspect
import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from bench.scale_sim import cluster as cluster_module
from bench.scale_sim import outside, report, scenarios, stalls, validate
from bench.scale_sim.cluster import Cluster, Options
from bench.scale_sim.gateway import USAGE_FLUSH_S, product_settings
from bench.scale_sim.model import CPU, WorkerConfig
from bench.scale_sim.prewarm import top_choice
from bench.scale_sim.tiers import DiskTier
from bench.scale_sim.worker import Req, SimWorker
from bench.scale_sim.workload import Population, Requests
from preft_serve.gateway import proxy
from preft_serve.gateway.routing import WorkerPool, rendezvous_order
from preft_serve.gateway.selection import adapter_target
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.gateway.usage import UsageRecorder
from preft_serve.worker.adapter_tiers.disk_cache import AdapterDiskCache

ROOT = Path(__file__).resolve().parents[2]
QUICK = scenarios.QUICK


@pytest.fixture(scope="module")
def loss_run() -> scenarios.Run:
    """A quick worker-loss run, its cluster kept for inspection, every choice recorded."""
    calls: list[tuple[str, str, str]] = []
    choose = WorkerPool.choose

    def spy(self: WorkerPool, key: str, prefill_hop: bool = False, classic=None):  # type: ignore[no-untyped-def]
        choice = choose(self, key, prefill_hop, classic)
        calls.append((key, choice.order[0], choice.result.value))
        return choice

    WorkerPool.choose = spy  # type: ignore[method-assign]
    try:
        run = scenarios.Run("worker_loss", QUICK, CPU, 0)
        end = QUICK.warm_s + QUICK.measure_s
        run.traffic(0, end)
        victim = run.cluster.endpoints[3]
        run.cluster.at(QUICK.warm_s, lambda: run.cluster.lose(victim))
        run.mark(0.0, end)
        run.go(end)
    finally:
        WorkerPool.choose = choose  # type: ignore[method-assign]
    run.extra["calls"] = calls
    run.extra["victim"] = victim
    return run


def test_no_request_is_lost_and_load_is_conserved(loss_run: scenarios.Run) -> None:
    cluster = loss_run.cluster
    assert cluster.next_id > 1000
    assert cluster.open == 0
    assert sorted(r.id for r in cluster.finished) == list(range(cluster.next_id))
    states = {r.state for r in cluster.finished}
    assert states <= {"done", "failed"}
    failed = [r for r in cluster.finished if r.state == "failed"]
    assert failed and {r.error for r in failed} == {"worker_lost"}
    assert all(r.worker == loss_run.extra["victim"] for r in failed)
    # Every acquire was released: no gateway holds an in-flight count, no worker a request.
    for gw in cluster.gateways:
        assert gw.pool.open_requests() == 0, gw.pool.inflight
    for worker in [*cluster.workers.values(), *cluster.gone.values(), *cluster.retired]:
        assert not worker.running and not worker.waiting
    done = [r for r in cluster.finished if r.state == "done"]
    assert all(r.t0 <= r.first <= r.done for r in done)
    assert all(r.tier and r.route for r in done)


def test_the_products_worker_pool_routes(loss_run: scenarios.Run) -> None:
    cluster, calls = loss_run.cluster, loss_run.extra["calls"]
    workers = [f"http://w{k}.0:8000" for k in range(QUICK.workers)]  # before the loss
    checked = 0
    for req in cluster.finished:
        if req.state != "done" or req.t0 >= QUICK.warm_s:
            continue  # before the loss: one choice per request, every worker reachable
        key, first, result = calls[req.id]
        assert key == req.sha
        assert (req.worker, req.route) == (first, result)
        if result == "preferred":  # nothing resident under the cap: the rendezvous favourite
            assert req.worker == rendezvous_order(req.sha, workers)[0]
        checked += 1
    assert checked > 300


def _blake_top(key: str, workers: list[str]) -> str:
    return max(
        workers, key=lambda w: hashlib.blake2b(f"{key}\0{w}".encode(), digest_size=8).digest()
    )


def test_movement_matches_an_independent_count() -> None:
    workers = [f"http://w{k}.0:8000" for k in range(QUICK.workers)]
    keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(QUICK.adapters)]
    weights = np.ones(len(keys))
    for after in (workers[:-1], [*workers, "http://w10.0:8000"]):
        sim = scenarios.moved(keys, weights, workers, after)
        independent = sum(_blake_top(k, workers) != _blake_top(k, after) for k in keys)
        assert sim["adapters_moved"] == round(independent / len(keys), 4)
        assert sim["adapters_moved"] <= sim["bound"]
    homes = top_choice(keys[:200], workers)
    assert [workers[h] for h in homes] == [rendezvous_order(k, workers)[0] for k in keys[:200]]


class _Store:
    """An object store of adapters of given sizes, for the product's disk cache."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes

    def fetch_adapter(self, sha: str, dest: Path, *, verify: bool = True) -> Path:
        dest.mkdir(parents=True)
        (dest / "adapter_config.json").write_text("{}")
        (dest / "adapter_model.safetensors").write_bytes(b"x" * (self.sizes[sha] - 2))
        return dest


def test_disk_tier_evicts_like_adapter_disk_cache(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    shas = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(30)]
    sizes = {s: int(rng.integers(1000, 5000)) for s in shas}
    real = AdapterDiskCache(_Store(sizes), tmp_path, max_bytes=20_000)
    sim = DiskTier(20_000)
    for step in range(300):
        sha = shas[int(rng.zipf(1.3)) % len(shas)]
        if step % 17 == 5 and sha in sim:
            real.demote(sha)
            sim.demote(sha)
            continue
        real.get(sha)
        if not sim.note_use(sha):
            sim.insert(sha, sizes[sha])
        assert real.lru_order() == list(sim.entries), step
    assert real.total_bytes == sim.bytes and sim.evictions > 0


def test_same_seed_same_json_and_another_seed_differs(tmp_path: Path) -> None:
    def run(seed: int, name: str) -> str:
        out = tmp_path / name
        subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.scale_sim",
                "--quick",
                "--seed",
                str(seed),
                "--out",
                str(out),
                "--scenario",
                "steady",
                "--scenario",
                "hot_swap",
                "--no-validate",
            ],
            check=True,
            cwd=ROOT,
            capture_output=True,
            timeout=120,
        )
        return out.with_suffix(".json").read_text()

    a, b, c = run(3, "a"), run(3, "b"), run(4, "c")
    assert a == b
    assert a != c
    result = json.loads(a)
    for res in result["scenarios"].values():
        assert res["requests_open_at_end"] == 0
        for window in res["windows"].values():
            assert abs(sum(window["tier_share"].values()) - 1) < 1e-3
            assert abs(sum(window["routing_share"].values()) - 1) < 1e-3
    swap = result["scenarios"]["hot_swap"]
    assert swap["windows"]["first_10s"]["redis_per_s"]["worker HVALS prefetch"] > 0


def test_agrees_with_the_recorded_load_test() -> None:
    check = validate.compare(validate.REQUIRED[0])
    assert check["agrees"], json.dumps(check, indent=1)
    assert check["simulated"]["open_at_end"] == 0


def test_a_pause_is_a_run_of_long_steps_less_the_work_done() -> None:
    # median step 10 ms; steps of 300 and 400 ms in a row are one pause, 600 ms another
    pauses = stalls.measure(0.5, [0.01, 0.3, 0.4, 0.01, 0.01, 0.6, 0.01])
    assert [x for pause in pauses for x in pause] == pytest.approx([0.51, 1.19, 1.23, 1.82])
    assert stalls.measure(0.0, [0.01, 0.2, 0.01]) == ()


def test_a_paused_worker_finishes_nothing_in_its_pause() -> None:
    worker = SimWorker(
        "http://w0.0:8000",
        CPU,
        WorkerConfig(),
        np.random.default_rng(0),
        0.0,
        pauses=((1.0, 2.0), (3.0, 3.5)),
    )
    assert worker.after(0.0, 0.5) == 0.5
    assert worker.after(0.5, 1.0) == pytest.approx(2.5)  # half before, half after
    assert worker.after(1.5, 0.1) == pytest.approx(2.1)  # begun inside: waits it out
    assert worker.after(0.5, 2.0) == pytest.approx(4.0)  # through both


def _backlog(
    config: WorkerConfig,
    prompts: list[int],
    output: int,
    pauses: tuple[tuple[float, float], ...] = (),
) -> tuple[list[Req], list[list[tuple[int, int]]]]:
    """Requests with distinct adapters (in host memory) reach one worker at 0.5 s; the
    worker steps until it is idle. Returns the requests and each step's batch
    (request id, prompt tokens: 0 for a decode)."""
    worker = SimWorker(
        "http://w0.0:8000", CPU, config, np.random.default_rng(0), 0.0, pauses=pauses
    )
    reqs = [
        Req(i, 0.5, i, i, 0, f"a{i}", prompt, output, True, False)
        for i, prompt in enumerate(prompts)
    ]
    wake = None
    for req in reqs:
        worker.host.add(req.sha)
        wake = worker.arrive(req, 0.5) or wake
    batches = []
    while wake is not None:
        batches.append([(r.id, chunk) for r, chunk in worker.batch])
        assert len(worker.running) <= (config.max_num_seqs or CPU.max_num_seqs)
        _, wake = worker.step_done(wake)
    assert not worker.running and not worker.waiting
    return reqs, batches


def test_a_backlog_is_admitted_max_loras_adapters_a_step() -> None:
    """vLLM's scheduler: at most ``max_loras`` distinct adapters among the prompts of a step
    (a PreFT request frees its adapter once its prompt is computed) and ``max_num_seqs``
    running requests, so a backlog that waited out a pause drains over several steps."""
    config = WorkerConfig(max_loras=2, max_num_seqs=4)
    reqs, batches = _backlog(config, [20] * 7, 3, pauses=((0.4, 1.5),))
    prompts = [p for p in ([i for i, chunk in batch if chunk] for batch in batches) if p]
    # two adapters a step (max_loras); requests 3 and 4 alone: 4 running (max_num_seqs)
    assert prompts == [[0], [1, 2], [3], [4], [5, 6]]
    first = [r.first for r in reqs]
    assert first[0] > 1.5  # its step waited out the pause
    assert first[0] < first[1] == first[2] < first[3] < first[4] < first[5] == first[6]


def test_host_memory_and_slots_move_when_a_request_is_scheduled_not_when_it_arrives() -> None:
    """vLLM's LRU caches are used by the model runner for the adapters of a step: an
    adapter whose request waits for a step is not made recent, and one evicted from host
    memory before its step is parsed inside that step."""
    worker = SimWorker(
        "http://w0.0:8000",
        CPU,
        WorkerConfig(max_loras=1, max_cpu_loras=3),
        np.random.default_rng(0),
        0.0,
    )
    for sha in ("a", "b", "x"):
        worker.host.add(sha)
    wake = worker.arrive(Req(0, 0.0, 0, 0, 0, "x", 512, 1, True, False), 0.0)
    assert wake is not None
    assert (list(worker.host.entries), list(worker.slots.entries)) == (["a", "b", "x"], ["x"])
    worker.arrive(Req(1, 0.001, 1, 1, 0, "a", 16, 1, True, False), 0.001)  # waits: x's step
    assert (list(worker.host.entries), list(worker.slots.entries)) == (["a", "b", "x"], ["x"])
    assert worker.waiting[0].tier == "host"
    _, wake = worker.step_done(wake)  # the next step schedules "a"
    assert (list(worker.host.entries), list(worker.slots.entries)) == (["b", "x", "a"], ["a"])
    assert wake is not None
    worker.arrive(Req(2, wake - 0.001, 2, 2, 0, "b", 16, 1, True, False), wake - 0.001)
    assert worker.waiting[0].tier == "host"
    worker.host.add("c")  # another use meanwhile: "b" leaves host memory before its step
    parses = worker.parses
    _, wake = worker.step_done(wake)
    assert worker.parses == parses + 1 and list(worker.host.entries) == ["a", "c", "b"]
    step = wake - worker.span_start if wake is not None else 0.0
    assert step > CPU.step_base_s + 16 * CPU.token_s + CPU.slot_copy_s  # the parse


def test_a_long_prompt_is_chunked_to_the_token_budget() -> None:
    """Chunked prefill: a step schedules at most ``max_num_batched_tokens``; a prompt
    longer than what is left takes the rest and goes on in the next step, and its first
    token comes with its last chunk. A step costs its tokens."""
    reqs, batches = _backlog(WorkerConfig(max_num_batched_tokens=64), [150, 10], 2)
    assert batches[:3] == [[(0, 64)], [(0, 64)], [(0, 22), (1, 10)]]
    assert batches[3] == [(0, 0), (1, 0)]  # both decode their second token
    # three steps of 64, 64 and 22 + 10 prompt tokens, each adapter copied into a slot once
    assert reqs[0].first == pytest.approx(
        0.5 + 3 * CPU.step_base_s + CPU.token_s * 160 + 2 * CPU.slot_copy_s
    )
    assert reqs[0].first == reqs[1].first


def test_two_workers_with_their_measured_pauses_and_time_outside_the_engines() -> None:
    """The two-worker run, its pauses replayed and its requests' time outside the engines
    measured: routing, store share and TTFT p50 agree, and the engines and the gateway hold
    as many requests as vLLM's and the gateway's own times say they held. Without the time
    outside, the same pauses put every request into the engines and the first token comes
    far too early."""
    path = validate.REQUIRED[-1]
    check = validate.compare(path)
    assert check["agrees"], json.dumps(check, indent=1)
    assert check["pauses"]["both_paused_share"] < check["pauses"]["both_if_independent"]
    real, sim = check["recorded"], check["simulated"]
    for held in ("engine_requests_mean", "gateway_requests_mean"):
        assert abs(sim[held] / real[held] - 1) < 0.15, held
    assert sim["open_at_end"] == 0
    pauses, fetch_s = stalls.load(path)
    _, inside = validate.fit_phase(real["setup"], real["throughput_rps"], 0, pauses, fetch_s)
    assert inside["ttft_p50_ms"] < 0.5 * real["ttft_p50_ms"]
    assert inside["engine_requests_mean"] > 1.2 * real["engine_requests_mean"]


def _page(requests: int, seconds: float) -> str:
    return (
        f"# HELP vllm:e2e_request_latency_seconds e2e\n"
        f"# TYPE vllm:e2e_request_latency_seconds histogram\n"
        f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="1.0",model_name="m"}} '
        f"{requests}\n"
        f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} '
        f"{requests}\n"
        f'vllm:e2e_request_latency_seconds_count{{engine="0",model_name="m"}} {requests}\n'
        f'vllm:e2e_request_latency_seconds_sum{{engine="0",model_name="m"}} {seconds}\n'
    )


def test_time_outside_the_engines_is_measured_per_component(tmp_path: Path) -> None:
    names = ("vllm:e2e_request_latency_seconds",)
    diff = outside.difference(
        outside.histograms(_page(2, 0.5), names), outside.histograms(_page(6, 2.5), names)
    )
    e2e = diff["vllm:e2e_request_latency_seconds"]
    assert (e2e["count"], e2e["mean_ms"], e2e["buckets"]["1.0"]) == (4, 500.0, 4)
    log = tmp_path / "gateway.log"
    log.write_text(
        "not json\n"
        + "\n".join(
            json.dumps(e)
            for e in (
                {
                    "route": "/v1/chat/completions",
                    "request_id": "a",
                    "latency_ms": 700.0,
                    "worker": "http://w1",
                },
                {"route": "/v1/models", "request_id": "b", "latency_ms": 1.0},
            )
        )
        + "\n"
    )
    access = outside.access_log(log)
    assert access == {"a": (700.0, "http://w1")}
    samples = [
        {"t": 10.0, "latency_s": 0.9, "ttft_s": 0.4, "error": None, "id": "a"},
        {"t": 10.5, "latency_s": 0.2, "ttft_s": None, "error": None, "id": "c"},
        {"t": 11.0, "latency_s": 0.1, "ttft_s": None, "error": "http_503", "id": "d"},
    ]
    rows = outside.request_rows(samples, access, ["http://w0", "http://w1"])
    assert rows == [[0.0, 900.0, 700.0, 400.0, 1], [0.5, 200.0, None, None, -1]]
    section = outside.timing_section(
        samples,
        rows,
        {},
        {
            **outside.histograms(_page(2, 0.8), names),
            "preft_gateway_request_seconds": {"sum": 1.4, "count": 2, "buckets": {}},
            "preft_worker_adapter_load_seconds{tier=disk}": {"sum": 0.1, "count": 1, "buckets": {}},
        },
    )
    # locust 550 ms a request, the gateway 700, the engine 400, fetches 50 per request
    b = section["breakdown_ms"]
    assert (b["locust_ms"], b["client_ms"], b["engine_ms"], b["fetch_ms"], b["slot_ms"]) == (
        550.0,
        -150.0,
        400.0,
        50.0,
        250.0,
    )


def test_a_request_outside_the_engine_holds_its_slot_and_delays_its_first_token() -> None:
    setup = {
        "adapters": 50,
        "users": 5,
        "tenants": 1,
        "duration": "20s",
        "max_tokens": [8, 8],
        "prompt_words": [10, 10],
        "stream_fraction": 1.0,
    }
    spent = outside.Outside(client_s=(0.2,), slot_mean_s=0.3)
    base = validate.simulate(setup, CPU, 0)
    held = validate.simulate(setup, CPU, 0, spent=spent)
    assert held["open_at_end"] == 0
    # each request waits 0.2 s as a client and ~0.3 s in its slot before its engine
    assert held["ttft_p50_ms"] > base["ttft_p50_ms"] + 300
    assert held["throughput_rps"] < base["throughput_rps"] * 0.6
    assert held["engine_requests_mean"] < base["engine_requests_mean"] * 0.6


def chart_values() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "charts" / "preft-serve" / "values.yaml").read_text())


def test_the_simulated_gateway_runs_the_products_settings_and_the_charts_values() -> None:
    """Every gateway setting the simulator runs with is the product's default, the chart
    deploys those defaults, and the simulator's chart-derived constants match the chart."""
    sim = Options(CPU).gateway
    for name, field in GatewaySettings.model_fields.items():
        if not field.is_required():
            assert getattr(sim, name) == field.get_default(call_default_factory=True), name
    assert inspect.signature(UsageRecorder).parameters["flush_interval_s"].default == USAGE_FLUSH_S
    values = chart_values()
    gateway, worker = values["gateway"], values["worker"]
    chart = {
        "cap_on_worker_load": gateway["capOnWorkerLoad"],
        "load_poll_interval_s": gateway["loadPollIntervalSeconds"],
        "hot_replicas": gateway["hotReplicas"],
        "hot_headroom": gateway["hotHeadroom"],
        "discovery_interval_s": gateway["discoveryIntervalSeconds"],
        "tenant_cold_loads": gateway["tenantColdLoads"],
    }
    assert chart == {name: getattr(sim, name) for name in chart}
    assert gateway["replicas"] == scenarios.CHART_GATEWAYS
    assert Options(CPU).pre_stop_s == worker["preStopSleepSeconds"]
    assert scenarios.CHART_WORKER.disk_bytes == worker["adapterCache"]["sizeGiB"] * 2**30
    assert (scenarios.CHART_WORKER.max_loras, scenarios.CHART_WORKER.max_cpu_loras) == (
        worker["maxLoras"],
        worker["maxCpuLoras"],
    )


def small_cluster(**settings: Any) -> Cluster:
    pop = Population(2_000, 200, 4, 1.0, 0)
    return Cluster(pop, Options(CPU, gateway=product_settings(**settings), workers=4, gateways=3))


def test_a_users_requests_all_go_through_one_gateway_and_users_spread_over_all() -> None:
    cluster = small_cluster()
    users = list(range(0, 2_000, 7))
    reqs = [cluster.submit(user, 32, 4, False) for user in users for _ in range(2)]
    by_user: dict[int, set[int]] = {}
    for req in reqs:
        by_user.setdefault(req.user, set()).add(req.gateway)
    assert set(by_user) == set(users) and all(len(g) == 1 for g in by_user.values())
    per_gateway = Counter(next(iter(g)) for g in by_user.values())
    assert len(per_gateway) == 3 and min(per_gateway.values()) > len(users) / 3 * 0.7


def test_a_request_that_reaches_a_worker_clears_its_failed_checks() -> None:
    cluster = small_cluster(unhealthy_after=2)
    gw = cluster.gateways[cluster.gateway_of(5)]
    key = gw.target(5).routing_key
    favourite = rendezvous_order(key, gw.pool.workers)[0]
    gw.pool.mark_failed(favourite)  # one failed health check: still in service
    req = cluster.submit(5, 32, 4, False)
    assert req.worker == favourite and gw.pool.status[favourite].failures == 0


def drain(cluster: Cluster) -> None:
    """Run the cluster's events until every submitted request is done or failed."""
    none = np.zeros(0)
    cluster.run(
        Requests(none, none.astype(int), none.astype(int), none.astype(int), none.astype(bool)), 0.0
    )


def test_a_gateway_at_its_open_request_limit_refuses_with_a_503_the_client_retries() -> None:
    """The pool's open-request limit answers 503; the client (the OpenAI SDK's defaults)
    sends the request again after its backoff, and it is served once a slot is free."""
    cluster = small_cluster(max_open_requests=3)
    users = [u for u in range(400) if cluster.gateway_of(u) == 0][:5]
    reqs = [cluster.submit(u, 32, 4, False) for u in users]
    assert [(r.state, r.retries) for r in reqs[3:]] == [("new", 1), ("new", 1)]
    assert cluster.gateways[0].pool.open_requests() == 3 and cluster.open == 5
    drain(cluster)
    assert [r.state for r in reqs] == ["done"] * 5
    assert all(r.first - r.t0 > 0.5 * 0.75 for r in reqs[3:])  # after the first backoff


def test_a_client_gives_up_after_its_retries() -> None:
    cluster = small_cluster(max_open_requests=1)
    first, second = (
        cluster.submit(u, 32, output, False)
        for u, output in zip([u for u in range(400) if cluster.gateway_of(u) == 0], (2_000, 4))
    )
    drain(cluster)
    assert first.state == "done"
    assert (second.state, second.error, second.retries) == ("failed", "gateway_busy", 2)
    # two backoffs: 0.5 s and 1 s, each less up to a quarter
    assert 0.75 * 1.5 <= second.done - second.t0 <= 1.5 + 0.01


def test_the_routing_key_is_the_one_select_target_gives() -> None:
    cluster = small_cluster()
    req = cluster.submit(11, 32, 4, False)
    ref = cluster.pop.ref(int(cluster.pop.user_adapter[11]))
    assert req.key == adapter_target(ref).routing_key == ref.sha256


def test_each_routing_decision_is_the_products_take_route(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The simulator routes a request (and each client retry) through the function the
    gateway's ``open_upstream`` calls, with the request's key and its tenant for the
    cold-load slot; a retry that holds a slot asks for none."""
    calls: list[tuple[str, str | None]] = []

    def spy(
        pool: WorkerPool, key: str, cold_tenant: str | None = None, prefill_hop: bool = False
    ) -> proxy.Route:
        calls.append((key, cold_tenant))
        return proxy.take_route(pool, key, cold_tenant, prefill_hop)

    monkeypatch.setattr(cluster_module, "take_route", spy)
    cluster = small_cluster(max_open_requests=1)
    users = [u for u in range(400) if cluster.gateway_of(u) == 0][:2]
    reqs = [cluster.submit(u, 32, 4, False) for u in users]
    drain(cluster)
    assert [r.state for r in reqs] == ["done", "done"] and reqs[1].retries == 1
    tenants = [f"t{r.tenant}" for r in reqs]
    assert calls[:2] == [(reqs[0].key, tenants[0]), (reqs[1].key, tenants[1])]
    assert len(calls) == 3 and calls[2][0] == reqs[1].key  # the retry


def test_goals_say_not_run_for_scenarios_that_did_not_run() -> None:
    measured = {"warm_hit": 0.95, "load_max_over_mean": 1.2, "requests_max_over_mean": 1.1}
    goals = report.goals({"steady": {"windows": {"measured": measured}, "events": []}})
    assert goals["warm_hit (steady)"]["met"] is True
    assert goals["moved_per_single_change"] == {"value": None, "met": None, "status": "not run"}
    assert goals["others_ttft_p99 (cold_storm)"]["status"] == "not run"
    assert goals["warm_hit (steady_s0.8)"]["met"] is None


def test_a_tenants_cold_requests_beyond_its_budget_are_refused_and_others_pass() -> None:
    cluster = small_cluster(tenant_cold_loads=1)
    pop = cluster.pop
    mine = [u for u in range(pop.n_users) if cluster.gateway_of(u) == 0]
    tenant = int(pop.user_tenant[mine[0]])
    same = [
        u
        for u in mine
        if pop.user_tenant[u] == tenant and pop.user_adapter[u] != pop.user_adapter[mine[0]]
    ]
    other = next(u for u in mine if pop.user_tenant[u] != tenant)
    first, second = (cluster.submit(u, 32, 4, False) for u in (mine[0], same[0]))
    third = cluster.submit(other, 32, 4, False)
    assert first.cold_tenant == f"t{tenant}" and first.state != "failed"
    assert (second.state, second.cold_tenant, second.retries) == ("new", "", 1)  # a 429
    assert third.state != "failed" and third.cold_tenant == f"t{pop.user_tenant[other]}"
    drain(cluster)
    assert [r.state for r in (first, second, third)] == ["done"] * 3
    assert (first.retries, third.retries) == (0, 0) and second.first > first.done
    assert not cluster.gateways[0].pool.cold.open


def test_a_cold_storm_is_measured_against_the_same_served_load_with_its_adapters_warm() -> None:
    """The storm's ratio divides the others' TTFT p99 by theirs under the load the storm
    run served, sent again with its adapters warm (the control), not by a calmer window
    before it."""
    scale = replace(QUICK, storm_users=400, measure_s=10.0)
    out = scenarios.cold_storm(scale, CPU, 0)
    cold, served = scenarios._storm(scale, CPU, 0, scenarios.CHART_WORKER)
    warm, _ = scenarios._storm(scale, CPU, 0, scenarios.CHART_WORKER, warm_users=served)
    mine = cold["storm_requests"]
    assert mine["sent"] == 400 and mine["served"] == len(served)
    assert mine["served"] + mine["refused_after_retries"] <= 400
    control = warm["storm_requests"]
    assert control["sent"] == control["served"] == len(served)
    assert control["retried"] == 0  # warm: no cold-load budget to refuse them
    cold_tiers = cold["windows"]["storm"]["tier_share"]
    warm_tiers = warm["windows"]["storm"]["tier_share"]
    assert warm_tiers["store"] < cold_tiers["store"]
    p99 = out["others_ttft_p99_ms"]
    assert p99["warm_control"] == warm["windows"]["storm"]["others_latency"]["ttft_p99_ms"]
    assert p99["storm"] == cold["windows"]["storm"]["others_latency"]["ttft_p99_ms"]
    assert out["others_ttft_p99_ratio"] == round(p99["storm"] / p99["warm_control"], 3)


def test_the_simulated_worker_and_client_run_their_defaults() -> None:
    """A simulated worker's defaults are ``serve.py``'s and ``WorkerSettings``' (what the
    validation's load test runs), and a client retries as the OpenAI client does."""
    from openai import _constants

    from bench.scale_sim import cluster
    from preft_serve.worker.serve import parser
    from preft_serve.worker.settings import WorkerSettings

    serve = parser()
    sim = WorkerConfig()
    assert (sim.max_loras, sim.max_cpu_loras) == (
        serve.get_default("max_loras"),
        serve.get_default("max_cpu_loras"),
    )
    assert sim.resolver_threads == WorkerSettings.model_fields["resolver_threads"].default
    assert (cluster.CLIENT_RETRIES, cluster.RETRY_DELAY_S, cluster.RETRY_DELAY_MAX_S) == (
        _constants.DEFAULT_MAX_RETRIES,
        _constants.INITIAL_RETRY_DELAY,
        _constants.MAX_RETRY_DELAY,
    )
