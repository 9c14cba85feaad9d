"""GET /v1/usage broken down per user, key and hour, on the suite's real Redis: the split
of requests the test sent through a real gateway (two users, two keys) read back through the
gateway from a real registry; hourly buckets; the bound on named users per bucket; bad
queries refused with a message; another tenant's usage never shown."""

from __future__ import annotations

import asyncio
import datetime
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import redis
import redis.asyncio as aioredis

from preft_serve.common.registry_client import RegistryKeys
from preft_serve.common.usage_breakdown import HOURLY_TTL_S, hour_key
from preft_serve.gateway.metrics import GatewayMetrics
from preft_serve.gateway.usage import UsageRecorder
from tests.finetune.conftest import ADMIN_TOKEN
from tests.gateway import test_tenant_forwarding as forwarding
from tests.gateway.test_tenant_forwarding import BASE, Stack
from tests.support.gateway import MSGS

# The real registry and gateway of the forwarding tests (fixtures, found by name).
model_dir, stack = forwarding.model_dir, forwarding.stack
KINDS = ("requests", "prompt_tokens", "completion_tokens")


def _key_id(key: str) -> str:
    return key.removeprefix("pft_").split(".")[0]


def _second_key(s: Stack, tenant: str) -> str:
    made = httpx.post(
        f"{s.registry.url}/v1/tenants/{tenant}/keys",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=30,
    )
    assert made.status_code == 201, made.text
    return str(made.json()["api_key"])


def _usage(s: Stack, key: str, **params: Any) -> dict[str, Any]:
    got = s.call(key, "GET", "/v1/usage", params=params)
    assert got.status_code == 200, got.text
    return got.json()  # type: ignore[no-any-return]


def _totals(report: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Counts per name over all buckets (``other``/``no_user`` under those names)."""
    found: dict[str, Counter[str]] = {}
    for bucket in report["buckets"]:
        named = [(item["name"], item) for item in bucket["items"]]
        named += [
            (f"({extra})", bucket[extra]) for extra in ("other", "no_user") if extra in bucket
        ]
        for name, counts in named:
            total = found.setdefault(name, Counter())
            for kind in KINDS:
                total[kind] += counts[kind]
    return {name: dict(counts) for name, counts in found.items()}


def test_two_users_and_two_keys_are_split_as_sent(stack: Callable[..., Stack]) -> None:
    s = stack()
    key1 = s.registry.tenant("acme")
    key2 = _second_key(s, "acme")
    rival = s.registry.tenant("globex")
    sent = [(key1, "alice")] * 3 + [(key1, "bob")] + [(key2, "alice")] * 2 + [(key2, None)]
    by_user: dict[str, Counter[str]] = {}
    by_key: dict[str, Counter[str]] = {}
    for key, user in [*sent, (rival, "mallory")]:
        body: dict[str, Any] = {"model": BASE, "messages": MSGS, "max_tokens": 4}
        if user is not None:
            body["user"] = user
        answer = s.call(key, "POST", "/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        if key == rival:
            continue
        usage = answer.json()["usage"]
        for table, name in ((by_user, user or "(no_user)"), (by_key, _key_id(key))):
            counts = table.setdefault(name, Counter())
            counts["requests"] += 1
            counts["prompt_tokens"] += usage["prompt_tokens"]
            counts["completion_tokens"] += usage["completion_tokens"]
    expected_users = {name: dict(c) for name, c in by_user.items()}
    expected_keys = {name: dict(c) for name, c in by_key.items()}
    assert len(expected_keys) == 2 and set(expected_users) == {"alice", "bob", "(no_user)"}

    deadline = time.monotonic() + 10  # the gateway writes its counts once a second
    while _totals(_usage(s, key1, by="key")) != expected_keys:
        assert time.monotonic() < deadline, _usage(s, key1, by="key")
        time.sleep(0.1)
    # Either key reads the tenant's usage, and the same through the registry itself.
    for key in (key1, key2):
        assert _totals(_usage(s, key, by="user")) == expected_users
        assert _totals(_usage(s, key, group_by="hour", by="user")) == expected_users
        assert _totals(_usage(s, key, group_by="hour", by="key")) == expected_keys
    direct = s.registry.call(key2, "GET", "/v1/usage", params={"by": "user"})
    assert direct.json() == _usage(s, key2, by="user")

    report = _usage(s, key1, group_by="hour", by="model")
    assert report["group_by"] == "hour" and report["by"] == "model"
    assert _totals(report) == {
        BASE: {kind: sum(c[kind] for c in expected_keys.values()) for kind in KINDS}
    }
    assert report["bounds"] == {
        "named_per_bucket": 100,
        "hourly_days": 7,
        "max_days": 92,
        "max_hours": 168,
    }
    # Items come most requests first.
    for bucket in _usage(s, key1, by="user")["buckets"]:
        counts = [item["requests"] for item in bucket["items"]]
        assert counts == sorted(counts, reverse=True)

    # globex sees its own request only, and acme's none.
    theirs = _usage(s, rival, by="user")
    assert set(_totals(theirs)) == {"mallory"}
    assert _totals(_usage(s, rival, by="key")) == {_key_id(rival): _totals(theirs)["mallory"]}
    assert "mallory" not in _totals(_usage(s, key1, by="user"))
    # The per-day report (no breakdown parameters) keeps its shape.
    plain = _usage(s, key1)
    assert set(plain) == {"tenant", "start", "end", "days"}
    assert [m["model"] for day in plain["days"] for m in day["models"]] == [BASE]


def _record(
    s: Stack, redis_url: str, writes: list[tuple[float, str, str | None, str]], cap: int = 100
) -> None:
    """Write (time, tenant, user, key id) requests as the gateway does, one flush each
    (several gateways' batches, in the order given); 10 prompt and 2 completion tokens."""

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            for when, tenant, user, key_id in writes:
                recorder = UsageRecorder(
                    client,
                    s.namespace,
                    GatewayMetrics(),
                    flush_interval_s=3600,
                    clock=lambda when=when: when,
                    named_per_bucket=cap,
                )
                recorder.record(
                    tenant,
                    BASE,
                    requests=1,
                    prompt_tokens=10,
                    completion_tokens=2,
                    user=user,
                    key_id=key_id,
                )
                await recorder.flush()
        finally:
            await client.aclose()

    asyncio.run(main())


def _hour(t: float) -> str:
    return datetime.datetime.fromtimestamp(t // 3600 * 3600, datetime.UTC).isoformat()


def test_hourly_buckets_hold_each_hours_requests(
    stack: Callable[..., Stack], redis_server: str
) -> None:
    s = stack()
    key = s.registry.tenant("acme")
    top = time.time() // 3600 * 3600
    times = [top - 5 * 3600 + 60, top - 5 * 3600 + 120, top - 2 * 3600 + 5, top - 3600 + 30]
    _record(s, redis_server, [(t, "acme", "alice", "k1") for t in times])
    expected = Counter(_hour(t) for t in times)
    since = str(int(top - 6 * 3600))
    report = _usage(s, key, group_by="hour", by="user", since=since)
    got = {
        datetime.datetime.fromisoformat(b["start"].replace("Z", "+00:00")).isoformat(): b["items"]
        for b in report["buckets"]
    }
    assert {h: [i["requests"] for i in items] for h, items in got.items()} == {
        h: [n] for h, n in expected.items()
    }
    assert all(items[0]["name"] == "alice" for items in got.values())
    # The report covers the bucket holding since to the one holding now.
    assert report["since"].startswith(_hour(top - 6 * 3600)[:13])
    days = Counter(
        datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d") for t in times
    )
    by_day = _usage(s, key, group_by="day", by="key", since=since)
    assert {b["start"][:10]: b["items"][0]["requests"] for b in by_day["buckets"]} == dict(days)
    # Hourly hashes expire after the days they are kept.
    sync = redis.Redis.from_url(redis_server)
    hour = datetime.datetime.fromtimestamp(times[0], datetime.UTC).strftime("%Y%m%d%H")
    ttl = sync.ttl(hour_key(RegistryKeys(s.namespace), "acme", hour, "user"))
    assert 0 < ttl <= HOURLY_TTL_S


def test_named_users_per_bucket_are_bounded_and_the_rest_is_other(
    stack: Callable[..., Stack], redis_server: str
) -> None:
    s = stack()
    key = s.registry.tenant("acme")
    now = time.time()
    # Five users, in this order, over several flushes; the cap is three names per bucket.
    order = ["u1", "u2", "u1", "u3", "u4", "u5", "u2", "u4", None]
    _record(s, redis_server, [(now, "acme", u, f"{i % 2:012x}") for i, u in enumerate(order)], 3)
    named = ["u1", "u2", "u3"]  # the first three seen
    report = _usage(s, key, by="user")
    (bucket,) = report["buckets"]
    assert {i["name"]: i["requests"] for i in bucket["items"]} == {u: order.count(u) for u in named}
    rest = sum(1 for u in order if u is not None and u not in named)
    assert bucket["other"] == {
        "requests": rest,
        "prompt_tokens": 10 * rest,
        "completion_tokens": 2 * rest,
    }
    assert bucket["no_user"]["requests"] == 1
    sync = redis.Redis.from_url(redis_server)
    day = datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y%m%d")
    fields = sync.hkeys(f"{RegistryKeys(s.namespace).usage('acme', day)}:user")
    names = {f.decode().rpartition(":")[0] for f in fields if b":" in f}
    assert names == {*named, "*other*", "*none*"}  # the hash itself holds no more names
    hourly = _usage(s, key, group_by="hour", by="user")
    assert _totals(hourly) == _totals(report)
    keys = _usage(s, key, by="key")
    assert {i["name"]: i["requests"] for b in keys["buckets"] for i in b["items"]} == {
        f"{0:012x}": 5,
        f"{1:012x}": 4,
    }


def test_bad_queries_are_refused_with_what_to_fix(
    stack: Callable[..., Stack], redis_server: str
) -> None:
    s = stack()
    key = s.registry.tenant("acme")
    sync = redis.Redis.from_url(redis_server)
    before = sorted(sync.scan_iter(match=f"{s.namespace}:usage:acme:*"))
    now = int(time.time())
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"group_by": "week"}, 422, "group_by"),
        ({"by": "adapter"}, 422, "by"),
        ({"since": "yesterday"}, 400, "is not a time"),
        ({"since": str(now), "until": str(now - 7200)}, 400, "swap them"),
        ({"group_by": "hour", "since": str(now - 10 * 86400)}, 400, "hourly usage is kept 7 days"),
        (
            {"group_by": "hour", "since": str(now - 3600), "until": str(now + 200 * 3600)},
            400,
            "at most 168 hours",
        ),
        ({"since": "2020-01-01", "until": "2020-12-31"}, 400, "at most 92 days"),
        ({"start": "2026-01-01", "by": "user"}, 400, "give since/until"),
        ({"since": "x" * 5000}, 400, "too long"),
    ]
    for params, status, says in cases:
        got = s.call(key, "GET", "/v1/usage", params=params)
        assert got.status_code == status, (params, got.text)
        error = got.json()["error"]
        assert says in error["message"] or says == error["param"], (params, error)
        assert len(got.text) < 2000  # nothing echoed unbounded
    assert sorted(sync.scan_iter(match=f"{s.namespace}:usage:acme:*")) == before
