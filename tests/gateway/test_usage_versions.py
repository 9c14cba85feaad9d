"""The per-version usage the gateway records: requests, tokens, errors after the version was
chosen and the time to first token (sum and count), kept in memory per request and written
with the batch into the day's and the hour's version hashes, beside the model/user/key ones
(which the errors leave untouched). Checked on the suite's real Redis against sums made here."""

from __future__ import annotations

import asyncio
import uuid

import redis
import redis.asyncio as aioredis

from preft_serve.common.registry_client import RegistryKeys, parse_usage
from preft_serve.common.usage_breakdown import day_key, hour_key, parse_versions
from preft_serve.gateway.metrics import GatewayMetrics
from preft_serve.gateway.usage import UsageRecorder

NOW = 1_767_268_800.0  # 2026-01-01T12:00:00Z
# (version served or None for the base model, status, prompt, completion, ttft or None)
SENT = [
    ("bot@1", 200, 7, 3, None),
    ("bot@1", 200, 9, 4, 0.25),
    ("bot@2", 200, 5, 2, 0.5),
    ("bot@2", 200, 6, 1, 0.125),
    ("bot@2", 500, 0, 0, None),
    ("bot@1", 400, 0, 0, None),
    ("bot@2", 503, 0, 0, None),
    (None, 200, 4, 4, 0.0625),
]


def _expected() -> dict[str, dict[str, int]]:
    found: dict[str, dict[str, int]] = {}
    for version, status, prompt, completion, ttft in SENT:
        counts = found.setdefault(
            version or "tiny",
            dict.fromkeys(
                ("requests", "prompt_tokens", "completion_tokens", "errors", "ttft_us_sum"), 0
            )
            | {"ttft_count": 0},
        )
        ok = status < 400
        counts["requests"] += ok
        counts["prompt_tokens"] += prompt
        counts["completion_tokens"] += completion
        counts["errors"] += not ok
        if ttft is not None:
            counts["ttft_us_sum"] += int(ttft * 1_000_000)
            counts["ttft_count"] += 1
    return found


def test_versions_count_requests_tokens_errors_and_ttft(redis_server: str) -> None:
    namespace = f"uv{uuid.uuid4().hex[:8]}"
    keys = RegistryKeys(namespace)
    sync = redis.Redis.from_url(redis_server)

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_server)
        recorder = UsageRecorder(
            client, namespace, GatewayMetrics(), flush_interval_s=3600, clock=lambda: NOW
        )
        for version, status, prompt, completion, ttft in SENT:
            ok = status < 400
            recorder.record(
                "acme",
                "tiny" if version is None else "bot",
                requests=int(ok),
                prompt_tokens=prompt,
                completion_tokens=completion,
                user="alice",
                version=version,
                errors=int(not ok),
                ttft_s=ttft,
            )
        await asyncio.sleep(0.05)
        assert sync.exists(day_key(keys, "acme", "20260101", "version")) == 0  # batched
        await recorder.flush()
        await client.aclose()

    asyncio.run(main())
    expected = _expected()
    for key in (
        day_key(keys, "acme", "20260101", "version"),
        hour_key(keys, "acme", "2026010112", "version"),
    ):
        assert parse_versions(sync.hgetall(key)) == expected
        assert sync.ttl(key) > 0
    # The model hash counts what was answered, per name; errors are not requests there.
    ok = [s for s in SENT if s[1] < 400]
    assert parse_usage(sync.hgetall(keys.usage("acme", "20260101"))) == {
        name: {
            "requests": sum(1 for s in ok if (s[0] or "tiny").split("@")[0] == name),
            "prompt_tokens": sum(s[2] for s in ok if (s[0] or "tiny").split("@")[0] == name),
            "completion_tokens": sum(s[3] for s in ok if (s[0] or "tiny").split("@")[0] == name),
        }
        for name in ("bot", "tiny")
    }
    users = parse_usage(sync.hgetall(day_key(keys, "acme", "20260101", "user")))
    assert users["alice"]["requests"] == len(ok)


def test_an_error_only_batch_writes_no_empty_fields(redis_server: str) -> None:
    namespace = f"uv{uuid.uuid4().hex[:8]}"
    keys = RegistryKeys(namespace)
    sync = redis.Redis.from_url(redis_server)

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_server)
        recorder = UsageRecorder(
            client, namespace, GatewayMetrics(), flush_interval_s=3600, clock=lambda: NOW
        )
        recorder.record("acme", "bot", user="bob", version="bot@3", errors=1)
        await recorder.flush()
        await client.aclose()

    asyncio.run(main())
    assert sync.hgetall(day_key(keys, "acme", "20260101", "version")) == {b"bot@3:errors": b"1"}
    for dimension in ("user", "key"):
        assert sync.exists(day_key(keys, "acme", "20260101", dimension)) == 0
    assert sync.exists(keys.usage("acme", "20260101")) == 0
