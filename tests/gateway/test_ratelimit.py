"""Rate limits: token buckets in a real Redis, 429 + Retry-After, fail-open without Redis."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from fastapi.testclient import TestClient

from preft_serve.common.registry_client import RegistryKeys
from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, MSGS, PATIENT_LIMITER_S, FakeRegistry, Workers, message
from tests.support.ports import free_port
from tests.support.redis_process import RedisProcess


def _client(
    redis_url: str, workers: Workers, namespace: str | None = None, **limits: Any
) -> TestClient:
    limits.setdefault("ratelimit_timeout_s", PATIENT_LIMITER_S)  # the outage test sets 0.2
    settings = GatewaySettings(
        worker_urls=["http://w1:8000"],
        base_model_name="tiny",
        namespace=namespace or f"rl{uuid.uuid4().hex[:8]}",
        **limits,
    )
    app = create_app(
        settings,
        transport=httpx.MockTransport(workers),
        registry=FakeRegistry(),
        redis_client=aioredis.Redis.from_url(redis_url),
    )
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture
def workers() -> Workers:
    return Workers()


def chat(client: TestClient, **body: Any) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"messages": MSGS, **body}, headers=AUTH)


def test_tenant_bucket_allows_its_burst_then_429(redis_server: str, workers: Workers) -> None:
    with _client(redis_server, workers, tenant_rps=0.5, tenant_burst=3) as client:
        assert [chat(client, user="u1").status_code for _ in range(3)] == [200] * 3
        refused = chat(client, user="u1")
        assert refused.status_code == 429
        # An empty bucket refills one token in 1/0.5 = 2 s.
        assert refused.headers["Retry-After"] == "2"
        assert message(refused) == (
            "rate limit exceeded for tenant acme: 0.5 requests/s with bursts of 3; retry after 2 s"
        )
        assert len(workers.seen) == 3  # the refused request never reached a worker
        text = client.get("/metrics").text
    assert 'preft_gateway_rate_limited_total{scope="tenant"} 1.0' in text
    assert 'preft_gateway_requests_total{adapter="none",status="429"} 1.0' in text


def test_user_bucket_is_per_user_and_spares_the_tenant_bucket(
    redis_server: str, workers: Workers
) -> None:
    with _client(
        redis_server, workers, tenant_rps=0.1, tenant_burst=2, user_rps=0.1, user_burst=1
    ) as client:
        assert chat(client, user="u1").status_code == 200  # tenant 1 left, u1 0 left
        by_user = chat(client, user="u1")
        assert by_user.status_code == 429 and "for user u1: 0.1 requests/s" in message(by_user)
        assert by_user.headers["Retry-After"] == "10"
        # The user refusal took nothing from the tenant: one more request fits.
        assert chat(client, model="bot").status_code == 200
        by_tenant = chat(client, model="bot")
        assert by_tenant.status_code == 429 and "for tenant acme" in message(by_tenant)
        text = client.get("/metrics").text
    assert 'preft_gateway_rate_limited_total{scope="user"} 1.0' in text
    assert 'preft_gateway_rate_limited_total{scope="tenant"} 1.0' in text
    assert len(workers.seen) == 2


def test_limits_off_by_default_and_fail_open_without_redis(workers: Workers) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with _client(dead, workers) as client:
        assert all(chat(client, user="u1").status_code == 200 for _ in range(5))
    with _client(dead, workers, tenant_rps=1, tenant_burst=1) as client:
        assert [chat(client, user="u1").status_code for _ in range(3)] == [200] * 3
        text = client.get("/metrics").text
    assert 'preft_gateway_errors_total{cause="rate_limit_unavailable"} 3.0' in text


def test_tenant_overrides_from_the_registry_replace_the_defaults(
    redis_server: str, workers: Workers
) -> None:
    namespace = f"rl{uuid.uuid4().hex[:8]}"
    overrides = RegistryKeys(namespace).tenant_rate_limits("acme")
    store = redis.Redis.from_url(redis_server)
    with _client(redis_server, workers, namespace, limits_cache_s=0) as client:
        assert all(chat(client, user="u1").status_code == 200 for _ in range(4))  # no limits
        store.hset(overrides, mapping={"user_rps": "0.2", "user_burst": "1"})
        assert chat(client, user="u1").status_code == 200
        limited = chat(client, user="u1")
        assert limited.status_code == 429 and "for user u1: 0.2 requests/s" in message(limited)
        assert limited.headers["Retry-After"] == "5"
        assert chat(client, user="u2", model="bot").status_code == 200  # its own bucket
        store.delete(overrides)
        assert chat(client, user="u1").status_code == 200
    with _client(redis_server, workers, namespace, limits_cache_s=0, tenant_rps=100) as client:
        store.hset(overrides, mapping={"tenant_rps": "0"})  # 0 turns the default off
        assert all(chat(client, user="u1").status_code == 200 for _ in range(250))
    store.close()


@pytest.mark.parametrize("rps", ["1e-13", "5e-324"])
def test_absurdly_slow_rates_still_limit(redis_server: str, workers: Workers, rps: str) -> None:
    """A refill time of ~1e16 ms was a key TTL PEXPIRE refused: every charge raised
    after writing the bucket, so the request was let through as if Redis were down
    (counted and logged as an outage) and the key never expired."""
    namespace = f"rl{uuid.uuid4().hex[:8]}"
    store = redis.Redis.from_url(redis_server)
    store.hset(
        RegistryKeys(namespace).tenant_rate_limits("acme"),
        mapping={"tenant_rps": rps, "tenant_burst": "1"},
    )
    with _client(redis_server, workers, namespace, limits_cache_s=0) as client:
        statuses = [chat(client, user="u1").status_code for _ in range(3)]
        text = client.get("/metrics").text
    store.close()
    assert statuses == [200, 429, 429]
    assert "rate_limit_unavailable" not in text


def test_output_tokens_per_minute_are_charged_up_front(redis_server: str, workers: Workers) -> None:
    with _client(redis_server, workers, user_tpm=12, user_rps=0.01, user_burst=2) as client:
        # max_tokens x n = 10 of the user's 12 tokens; 1 of its 2 requests.
        assert chat(client, user="u1", max_tokens=5, n=2).status_code == 200
        refused = chat(client, user="u1", max_tokens=3)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        # 1 token short at 12/minute = 0.2 tokens/s: 5 s.
        assert refused.headers["Retry-After"] == "5"
        assert message(refused) == (
            "token rate limit exceeded for user u1: this request reserves 3 output tokens "
            "(prompts x n x max_tokens) of 12 output tokens/minute; retry after 5 s"
        )
        # Refused by its token bucket, the request took nothing from the request bucket:
        # one request and 2 tokens are still there.
        assert chat(client, user="u1", max_tokens=2).status_code == 200
        by_requests = chat(client, user="u1", max_tokens=1)
        assert by_requests.status_code == 429 and "0.01 requests/s" in message(by_requests)
        assert chat(client, user="u2", model="bot", max_tokens=12).status_code == 200
        text = client.get("/metrics").text
    assert len(workers.seen) == 3
    assert 'preft_gateway_rate_limited_total{scope="user_tokens"} 1.0' in text
    assert 'preft_gateway_rate_limited_total{scope="user"} 1.0' in text


def test_a_request_larger_than_the_token_budget_is_refused_outright(
    redis_server: str, workers: Workers
) -> None:
    namespace = f"rl{uuid.uuid4().hex[:8]}"
    store = redis.Redis.from_url(redis_server)
    store.hset(RegistryKeys(namespace).tenant_rate_limits("acme"), mapping={"tenant_tpm": "60"})
    with _client(redis_server, workers, namespace, max_tokens_cap=100) as client:
        # No max_tokens: the gateway's cap (100) is reserved, more than the 60 a minute.
        resp = chat(client, user="u1")
        assert resp.status_code == 429 and "Retry-After" not in resp.headers
        assert message(resp) == (
            "this request reserves 100 output tokens (prompts x n x max_tokens), more than "
            "the whole budget of tenant acme (60 output tokens/minute); lower max_tokens or n"
        )
        assert chat(client, user="u1", max_tokens=30, n=2).status_code == 200
        assert chat(client, user="u1", max_tokens=1).status_code == 429  # all 60 taken
        text = client.get("/metrics").text
    store.close()
    assert len(workers.seen) == 1 and workers.seen[0]["max_tokens"] == 30
    assert 'preft_gateway_rate_limited_total{scope="tenant_tokens"} 2.0' in text


def test_a_stalled_redis_delays_a_request_by_the_limiter_timeout_only(
    tmp_path: Path, workers: Workers
) -> None:
    server = RedisProcess(tmp_path).start()
    try:
        with _client(
            server.url, workers, tenant_rps=100, user_tpm=10_000, ratelimit_timeout_s=0.2
        ) as client:
            assert chat(client, user="u1", max_tokens=5).status_code == 200  # warm
            # Counted around the pause only: on a loaded machine Redis may also answer a
            # request before or after it later than the 0.2 s the limiter waits.
            before = _unavailable(client.get("/metrics").text)
            server.pause()
            timings = []
            for _ in range(2):
                start = time.monotonic()
                assert chat(client, user="u1", max_tokens=5).status_code == 200
                timings.append(time.monotonic() - start)
            during = _unavailable(client.get("/metrics").text) - before
            server.resume()
            assert chat(client, user="u1", max_tokens=5).status_code == 200
    finally:
        server.stop()
    assert max(timings) < 1.0, timings  # was the 5 s socket timeout (or more)
    assert during == 2
    assert len(workers.seen) == 4


def _unavailable(metrics: str) -> float:
    """``preft_gateway_errors_total{cause="rate_limit_unavailable"}`` (0 before the first)."""
    prefix = 'preft_gateway_errors_total{cause="rate_limit_unavailable"} '
    found = [float(line[len(prefix) :]) for line in metrics.splitlines() if line.startswith(prefix)]
    return found[0] if found else 0.0
