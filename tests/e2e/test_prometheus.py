"""A real Prometheus scrapes the running stack; PromQL reads per-adapter traffic off it.

Prometheus (the Debian ``prometheus`` server) scrapes the package's gateway and worker
every second. Known traffic goes to two adapters (``ignore_eos`` makes every completion
exactly ``TOKENS`` long); after a scrape that followed the traffic, one PromQL query per
counter (latest value minus the value at the window's start, via the ``@`` modifier) must
equal what was sent, adapter by adapter. A warm-up request per adapter comes first so the
series exist at the window's start (a counter series is born at its first increment,
which no difference over scrapes can see).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from preft_serve.adapters.format import AdapterMode
from preft_serve.toymodels import LoraSpec, make_lora_adapter
from tests.e2e.stack import PROMPT, Base, Registry, complete, token_ids
from tests.support.processes import ServiceProcess
from tests.support.prometheus import Prometheus, prometheus_binary, running_prometheus

TOKENS = 8
TRAFFIC = {"prom-a": 3, "prom-b": 5}  # requests per adapter (one of b's is streamed)
ADAPTERS = 'adapter=~"prom-a|prom-b"'
# "or vector(0)": before any download the labelled series does not exist yet.
WORKER_MISSES = 'sum(preft_worker_adapter_loads_total{job="worker", outcome="miss"}) or vector(0)'
WORKER_LOADS = 'count(preft_worker_adapter_loads_total{job="worker"})'


@pytest.fixture(scope="module", autouse=True)
def _needs_prometheus() -> None:
    """Skip (locally) or fail (CI) before the stack is built for nothing."""
    prometheus_binary()


@pytest.fixture(scope="module")
def prometheus(base: Base, gateway: ServiceProcess, worker: ServiceProcess) -> Iterator[Prometheus]:
    with running_prometheus(
        base.root / "prometheus", {"gateway": [gateway.url], "worker": [worker.url]}
    ) as server:
        yield server


@pytest.fixture(scope="module")
def api_key(base: Base, registry: Registry) -> str:
    key = registry.create_tenant("prom")
    # Seeds no other e2e module uses: the package's worker is shared, and an adapter of the
    # same content already on its disk would load as a hit, not the miss counted below.
    for seed, name in enumerate(TRAFFIC, start=971):
        folder = make_lora_adapter(
            base.model,
            base.root / "prom-adapters" / name,
            seed=seed,
            spec=LoraSpec(rank=8, mode=AdapterMode.PREFILL),
        )
        registry.upload(key, name, folder, "prefill")
        registry.bind(key, f"user-{name}", name)
    return key


def _stream_tokens(gateway: str, api_key: str, user: str) -> int:
    """Stream one completion; returns how many token ids arrived."""
    body = {
        "prompt": PROMPT,
        "max_tokens": TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": True,
        "user": user,
    }
    count = 0
    with httpx.stream(
        "POST",
        f"{gateway}/v1/completions",
        json=body,
        timeout=120,
        headers={"Authorization": f"Bearer {api_key}"},
    ) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                count += sum(len(c.get("token_ids") or []) for c in json.loads(line[6:])["choices"])
    return count


def test_promql_per_adapter_tokens_and_requests_match_the_traffic_sent(
    prometheus: Prometheus, gateway: ServiceProcess, api_key: str
) -> None:
    misses_before = _scalar(prometheus, WORKER_MISSES, after=time.time())
    for name in TRAFFIC:  # warm-up: the series exist before the first measurement
        assert (
            len(
                token_ids(
                    complete(gateway.url, api_key=api_key, user=f"user-{name}", max_tokens=TOKENS)
                )
            )
            == TOKENS
        )
    prometheus.wait_for_scrape_after("gateway", time.time())
    start = time.time()  # the latest scrape at or before this saw the warm-up only
    assert prometheus.by_label(
        f"sum by (adapter) (preft_gateway_generation_tokens_total{{{ADAPTERS}}})", "adapter"
    ) == dict.fromkeys(TRAFFIC, TOKENS)

    for name, count in TRAFFIC.items():
        for i in range(count):
            user = f"user-{name}"
            if name == "prom-b" and i == 0:
                assert _stream_tokens(gateway.url, api_key, user) == TOKENS
            else:
                reply = complete(gateway.url, api_key=api_key, user=user, max_tokens=TOKENS)
                assert len(token_ids(reply)) == TOKENS
    done = time.time()
    prometheus.wait_for_scrape_after("gateway", done)
    prometheus.wait_for_scrape_after("worker", done)

    # Per-adapter throughput over the traffic window, each in one PromQL query.
    tokens = f"preft_gateway_generation_tokens_total{{{ADAPTERS}}}"
    ok = f'preft_gateway_requests_total{{{ADAPTERS}, status="200"}}'
    assert prometheus.by_label(_since(tokens, start), "adapter") == {
        n: c * TOKENS for n, c in TRAFFIC.items()
    }
    assert prometheus.by_label(_since(ok, start), "adapter") == TRAFFIC
    # Each new adapter was downloaded into the worker's disk cache exactly once.
    assert prometheus.query(WORKER_LOADS), "the worker's adapter-load series are not scraped"
    assert _scalar(prometheus, WORKER_MISSES, after=done) - misses_before == len(TRAFFIC)


def _since(selector: str, start: float) -> str:
    """Increase of a counter by adapter from ``start`` (a unix time) to now: the latest
    sample minus the one in effect at ``start`` (the @ modifier). Exact, unlike
    ``increase()``, which extrapolates to the window's edges."""
    return f"sum by (adapter) ({selector}) - sum by (adapter) ({selector} @ {start:.3f})"


def _scalar(prometheus: Prometheus, promql: str, after: float) -> float:
    prometheus.wait_for_scrape_after("worker", after)
    result = prometheus.query(promql)
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def test_every_target_is_scraped(prometheus: Prometheus) -> None:
    """Both jobs are up, so the numbers above come from real scrapes of real processes."""
    prometheus.wait_for_scrape_after("gateway", time.time())
    prometheus.wait_for_scrape_after("worker", time.time())
    assert prometheus.by_label("up", "job") == {"gateway": 1.0, "worker": 1.0}
    assert prometheus.query('vllm:request_success_total{job="worker"}')
    assert prometheus.query('preft_gateway_routing_total{job="gateway"}')
