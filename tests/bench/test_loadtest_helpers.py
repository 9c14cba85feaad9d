"""The load tests' own logic: percentiles, mode spreading, the summary, the fake upstream."""

from __future__ import annotations

import asyncio
import json

import httpx

from bench.fake_worker import app as fake_worker
from bench.loadtest import engine_seconds, engine_summary, summarize
from bench.stack_setup import adapter_mode
from bench.stats import percentile
from preft_serve.adapters.format import AdapterMode
from preft_serve.gateway.proxy import EventRewriter
from preft_serve.worker.step_trace import Step


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0
    assert percentile(values, 90) == 90.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([], 50) is None


def test_all_mode_adapters_are_spread_evenly() -> None:
    modes = [adapter_mode(i, 0.25) for i in range(100)]
    assert modes.count(AdapterMode.ALL) == 25
    # Never two in a row at 25%: every block of four has exactly one.
    assert all(modes[i : i + 4].count(AdapterMode.ALL) == 1 for i in range(0, 100, 4))
    assert {adapter_mode(i, 0.0) for i in range(50)} == {AdapterMode.PREFILL}


def _sample(
    t: float,
    latency: float,
    stream: bool,
    tokens: int,
    error: str | None = None,
    ttft: float | None = None,
    user: str = "u1",
) -> dict[str, object]:
    return {
        "t": t,
        "latency_s": latency,
        "stream": stream,
        "tokens": tokens,
        "error": error,
        "ttft_s": ttft,
        "user": user,
    }


def test_summary_counts_only_successes_in_throughput() -> None:
    samples = [
        _sample(0.0, 1.0, False, 10, user="a"),
        _sample(1.0, 1.0, True, 20, ttft=0.1, user="b"),
        _sample(2.0, 1.0, True, 30, ttft=0.3, user="c"),
        _sample(2.5, 0.5, True, 4, ttft=None, user="c"),  # tokens, but no visible text
        _sample(3.0, 1.0, False, 0, error="http_429:rate_limited", user="a"),
        _sample(3.5, 0.5, False, 0, error="http_429:rate_limited", user="d"),
    ]
    summary = summarize(samples)
    assert summary["duration_s"] == 4.0  # first start to last end
    assert (summary["requests"], summary["ok"], summary["streamed_ok"]) == (6, 4, 3)
    assert summary["streamed_without_text"] == 1
    assert summary["throughput_rps"] == 1.0  # 4 ok / 4 s
    assert summary["throughput_tok_s"] == 16.0  # 64 tokens / 4 s
    assert summary["ttft_ms"]["p50"] == 100.0
    assert summary["ttft_ms"]["p99"] == 300.0
    assert summary["errors"] == {"http_429:rate_limited": 2}
    assert summary["distinct_users"] == 4


def _post(body: dict[str, object]) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=fake_worker)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
            return await client.post("/v1/chat/completions", json=body)

    return asyncio.run(go())


def test_fake_worker_answers_like_vllm() -> None:
    whole = _post({"model": "sha256:ab", "max_tokens": 5, "messages": []})
    assert whole.status_code == 200
    payload = whole.json()
    assert payload["model"] == "sha256:ab"
    assert payload["usage"]["completion_tokens"] == 5
    assert len(payload["choices"][0]["message"]["content"]) == 5

    stream = _post(
        {
            "model": "m",
            "max_tokens": 3,
            "stream": True,
            "messages": [],
            "stream_options": {"include_usage": True},
        }
    )
    events = [e for e in stream.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks[:-1]) == "xxx"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_fake_worker_events_are_compact_like_vllms_and_take_the_byte_level_rewrite() -> None:
    """vLLM writes compact JSON; the gateway rewrites ``model`` in such events as bytes and
    parses only the first text event and the usage chunk. A fake that wrote spaced JSON
    made the gateway parse every event, overstating its CPU in the benchmarks."""
    model = "sha256:" + "ab" * 32
    stream = _post(
        {
            "model": model,
            "max_tokens": 6,
            "stream": True,
            "messages": [],
            "stream_options": {"include_usage": True},
        }
    )
    events = [e.encode() for e in stream.text.split("\n\n") if e]
    parsed: list[bytes] = []
    rewriter = EventRewriter(model, "my-bot", strip_usage=False, on_usage=lambda _: None)
    parse = rewriter._parsed

    def spy(event: bytes) -> tuple[bytes | None, bool]:
        parsed.append(event)
        return parse(event)

    rewriter._parsed = spy  # type: ignore[method-assign]
    out = [rewriter.rewrite(event)[0] for event in events]
    assert len(parsed) == 2 and b'"usage"' in parsed[1]  # first text event, usage chunk
    assert all(b"my-bot" in e for e in out[:-1] if e) and model.encode() not in b"".join(
        e for e in out if e
    )
    whole = _post({"model": model, "max_tokens": 2, "messages": []})
    assert whole.content.startswith(b'{"id":"cmpl-fake","object":"chat.completion"')


def _steps(start: float, per_second: list[list[tuple[float, int]]]) -> list[Step]:
    """Steps laid out second by second: each (seconds, tokens), back to back."""
    steps = []
    for second, plan in enumerate(per_second):
        t = start + second
        for seconds, tokens in plan:
            steps.append(Step(t, seconds, tokens, requests=4))
            t += seconds
    return steps


def test_engine_seconds_split_steps_by_the_second_they_start_in() -> None:
    steps = _steps(100.0, [[(0.5, 800), (0.5, 200)], [(0.25, 40)] * 4])
    assert engine_seconds(steps, 100.0, 2) == [
        {"steps": 2, "tokens": 1000, "busy": 1.0},
        {"steps": 4, "tokens": 160, "busy": 1.0},
    ]
    # Steps before the start or after the last second are not counted.
    assert engine_seconds(steps, 101.0, 1) == [{"steps": 4, "tokens": 160, "busy": 1.0}]


def test_engine_summary_finds_the_starved_second_but_not_the_ramp_or_the_tail() -> None:
    busy = [(0.5, 4000), (0.5, 4000)]  # 8,000 tokens a second
    starved = [(0.1, 200)] * 10  # ten small steps: 2,000 tokens
    plan = [starved, busy, busy, starved, busy, busy, busy, starved]
    summary = engine_summary(_steps(0.0, plan), 0.0, len(plan), steady=(1, 7))
    assert summary["steps"] == 2 * 5 + 10 * 3
    assert summary["median_step_ms"] == 100.0  # 30 steps of 0.1 s, 10 of 0.5 s
    assert summary["longest_step_ms"] == 500.0
    assert summary["busy_share"] == 1.0
    # Seconds 1-6: 8,000 x 5 and 2,000 once; the median is 8,000, the lowest 2,000.
    assert summary["scheduled_tokens_per_s"] == {"median": 8000, "lowest": 2000}
    assert summary["starved_seconds"] == [3]  # not 0 (ramp-up) nor 7 (the tail)
    assert summary["steady_seconds"] == [1, 7]


def test_worker_metrics_are_summed_over_every_worker() -> None:
    """Two workers' adapter-load counters, each served over HTTP by prometheus-client: the
    load test's summary holds their sums per label set (the cluster's tier hit counts)."""
    from prometheus_client import CollectorRegistry, Counter, start_http_server

    from bench.loadtest import WORKER_METRICS, scrape_sum
    from tests.support.ports import free_port

    urls, servers = [], []
    for hits, misses in ((5, 1), (2, 3)):
        registry = CollectorRegistry()
        loads = Counter(
            "preft_worker_adapter_loads", "loads", ["tier", "outcome"], registry=registry
        )
        loads.labels("disk", "hit").inc(hits)
        loads.labels("disk", "miss").inc(misses)
        port = free_port()
        server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
        servers.append((server, thread))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        summed = scrape_sum(urls, WORKER_METRICS)
    finally:
        for server, thread in servers:
            server.shutdown()
            thread.join(5)
    assert summed == {
        "preft_worker_adapter_loads_total{outcome=hit,tier=disk}": 7.0,
        "preft_worker_adapter_loads_total{outcome=miss,tier=disk}": 4.0,
    }
