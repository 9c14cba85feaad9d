"""Usage accounting: per-tenant Prometheus counters (bounded labels) and per tenant, model
and UTC day counters in Redis, written in the background without failing requests."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from fastapi.testclient import TestClient

from preft_serve.common.registry_client import USAGE_TTL_S, RegistryKeys, parse_usage
from preft_serve.gateway.app import create_app
from preft_serve.gateway.metrics import GatewayMetrics
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.gateway.usage import UtcToday, utc_day
from tests.support.gateway import AUTH, MSGS, PATIENT_LIMITER_S, FakeRegistry, Workers
from tests.support.ports import free_port

# What tests.support.gateway.Workers reports for every completion.
PROMPT, COMPLETION = 5, 3


def _client(redis_url: str, workers: Workers, namespace: str, **settings: Any) -> TestClient:
    settings.setdefault("ratelimit_timeout_s", PATIENT_LIMITER_S)
    config = GatewaySettings(
        worker_urls=["http://w1:8000"], base_model_name="tiny", namespace=namespace, **settings
    )
    app = create_app(
        config,
        transport=httpx.MockTransport(workers),
        registry=FakeRegistry(),
        redis_client=aioredis.Redis.from_url(redis_url),
    )
    return TestClient(app, raise_server_exceptions=False)


def chat(client: TestClient, **body: Any) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"messages": MSGS, **body}, headers=AUTH)


def _value(text: str, sample: str) -> float:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


def _wait_for(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_tenant_counters_move_by_the_workers_usage(redis_server: str) -> None:
    namespace = f"us{uuid.uuid4().hex[:8]}"
    with _client(redis_server, Workers(), namespace, tenant_rps=0.01, tenant_burst=3) as client:
        assert chat(client, user="u1").status_code == 200
        assert chat(client, user="u1", stream=True).status_code == 200
        assert chat(client, model="tiny", user="u2").status_code == 200
        assert chat(client, user="u1").status_code == 429
        text = client.get("/metrics").text
    # Exposition sorts the labels by name.
    assert _value(text, 'preft_gateway_tenant_requests_total{status="200",tenant="acme"}') == 3
    assert _value(text, 'preft_gateway_tenant_requests_total{status="429",tenant="acme"}') == 1
    tokens = 'preft_gateway_tenant_tokens_total{{kind="{}",tenant="acme"}}'
    assert _value(text, tokens.format("prompt")) == 3 * PROMPT
    assert _value(text, tokens.format("completion")) == 3 * COMPLETION
    assert _value(text, "preft_gateway_usage_write_failures_total") == 0

    keys = RegistryKeys(namespace)
    sync = redis.Redis.from_url(redis_server)
    key = keys.usage("acme", utc_day())
    _wait_for(lambda: parse_usage(sync.hgetall(key)).get("tiny") is not None)
    assert parse_usage(sync.hgetall(key)) == {
        "bot": {"requests": 2, "prompt_tokens": 2 * PROMPT, "completion_tokens": 2 * COMPLETION},
        "tiny": {"requests": 1, "prompt_tokens": PROMPT, "completion_tokens": COMPLETION},
    }
    assert sync.hget(key, "bot:requests") == b"2"
    assert 0 < sync.ttl(key) <= USAGE_TTL_S


def test_tenant_labels_are_bounded() -> None:
    metrics = GatewayMetrics(max_tenants=2)
    assert [metrics.tenant_label(t) for t in ("a1", "b2", "c3", "a1")] == [
        "a1",
        "b2",
        "other",
        "a1",
    ]


def test_an_unreachable_redis_fails_no_request_and_is_counted() -> None:
    dead = f"redis://127.0.0.1:{free_port()}"
    with _client(dead, Workers(), "usdead", usage_timeout_s=0.2) as client:
        assert chat(client, user="u1").status_code == 200  # answered, though unbilled
        _wait_for(
            lambda: (
                _value(client.get("/metrics").text, "preft_gateway_usage_write_failures_total") >= 1
            )
        )


@pytest.mark.parametrize("day", ["2026121", "2026-12-01", "202612011"])
def test_usage_key_refuses_malformed_days(day: str) -> None:
    with pytest.raises(ValueError, match="usage day"):
        RegistryKeys("x").usage("acme", day)


def test_counts_are_batched_and_the_rest_written_at_shutdown(redis_server: str) -> None:
    """Requests add to counts in memory; nothing reaches Redis before a flush, one flush
    writes them all, and draining at shutdown writes what is left."""
    import asyncio

    from preft_serve.gateway.usage import UsageRecorder

    namespace = f"ub{uuid.uuid4().hex[:8]}"
    key = RegistryKeys(namespace).usage("acme", utc_day())
    sync = redis.Redis.from_url(redis_server)

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_server)
        recorder = UsageRecorder(client, namespace, GatewayMetrics(), flush_interval_s=3600)
        for _ in range(50):
            recorder.record("acme", "bot", requests=1, prompt_tokens=7, completion_tokens=3)
        await asyncio.sleep(0.05)
        assert sync.exists(key) == 0  # not written per request
        await recorder.flush()
        assert parse_usage(sync.hgetall(key)) == {
            "bot": {"requests": 50, "prompt_tokens": 350, "completion_tokens": 150}
        }
        recorder.record("acme", "bot", requests=1, completion_tokens=2)
        await recorder.drain()
        assert parse_usage(sync.hgetall(key))["bot"] == {
            "requests": 51,
            "prompt_tokens": 350,
            "completion_tokens": 152,
        }
        await client.aclose()

    asyncio.run(main())


def test_today_turns_at_utc_midnight_and_follows_a_clock_stepped_back() -> None:
    midnight = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    now = [midnight - 0.001]
    today = UtcToday(clock=lambda: now[0])
    assert today() == "20251231"
    now[0] = midnight
    assert today() == "20260101"
    now[0] = midnight + 86_399.999
    assert today() == "20260101"
    now[0] = midnight + 86_400
    assert today() == "20260102"
    now[0] = midnight - 3600  # an NTP step back over midnight
    assert today() == "20251231"
