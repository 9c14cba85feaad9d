"""GET /v1/usage: the gateway's per-day counters, read back per tenant and range."""

from __future__ import annotations

import datetime

import pytest
import redis
from fastapi.testclient import TestClient

from preft_serve.common.domain_errors import InvalidRequest
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry.usage import usage_range

DAY = datetime.date(2026, 3, 10)


def test_usage_per_day_and_model_for_the_callers_tenant_only(
    client: TestClient,
    acme: dict[str, str],
    new_tenant: object,
    redis_client: redis.Redis,
    namespace: str,
) -> None:
    keys = RegistryKeys(namespace)
    redis_client.hset(
        keys.usage("acme", "20260310"),
        mapping={
            "bot:requests": 2,
            "bot:prompt_tokens": 10,
            "bot:completion_tokens": 6,
            "tiny:requests": 1,
            "tiny:prompt_tokens": 5,
            "tiny:completion_tokens": 3,
        },
    )
    redis_client.hset(keys.usage("acme", "20260301"), mapping={"bot:requests": 9})
    redis_client.hset(keys.usage("globex", "20260310"), mapping={"rival:requests": 4})
    resp = client.get(
        "/v1/usage", params={"start": "2026-03-05", "end": "2026-03-11"}, headers=acme
    )
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "tenant": "acme",
        "start": "2026-03-05",
        "end": "2026-03-11",
        "days": [
            {
                "date": "2026-03-10",
                "models": [
                    {"model": "bot", "requests": 2, "prompt_tokens": 10, "completion_tokens": 6},
                    {"model": "tiny", "requests": 1, "prompt_tokens": 5, "completion_tokens": 3},
                ],
            }
        ],
    }
    today = client.get("/v1/usage", headers=acme).json()
    assert today["days"] == []
    assert (
        datetime.date.fromisoformat(today["end"]) - datetime.date.fromisoformat(today["start"])
    ).days == 6


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"start": "2026-03-10", "end": "2026-03-01"}, "start 2026-03-10 is after end 2026-03-01"),
        ({"start": "2026-01-01", "end": "2026-12-31"}, "spans 365 days; at most 92"),
        ({"end": "2026-02-30"}, "end '2026-02-30' is not a date (YYYY-MM-DD)"),
        # The default end (start + 6 days) and the default start (end - 6 days) run off the
        # calendar: an OverflowError, a 500 until a review found it.
        ({"start": "9999-12-31"}, "reaches past the calendar (years 1-9999)"),
        ({"end": "0001-01-01"}, "reaches past the calendar (years 1-9999)"),
    ],
)
def test_bad_ranges_are_400(
    client: TestClient, acme: dict[str, str], params: dict[str, str], needle: str
) -> None:
    resp = client.get("/v1/usage", params=params, headers=acme)
    assert resp.status_code == 400
    assert needle in resp.json()["error"]["message"]


def test_a_malformed_date_is_422_naming_the_parameter(
    client: TestClient, acme: dict[str, str]
) -> None:
    resp = client.get("/v1/usage", params={"start": "yesterday"}, headers=acme)
    assert resp.status_code == 422 and "start" in resp.text


def test_usage_needs_a_tenant_key(client: TestClient) -> None:
    assert client.get("/v1/usage").status_code == 401


def test_default_ranges() -> None:
    week = datetime.timedelta(days=6)
    assert usage_range(None, None, today=DAY) == (DAY - week, DAY)
    assert usage_range(DAY - 2 * week, None, today=DAY) == (DAY - 2 * week, DAY - week)
    assert usage_range(None, DAY - week, today=DAY) == (DAY - 2 * week, DAY - week)
    assert usage_range(DAY, None, today=DAY) == (DAY, DAY)
    with pytest.raises(InvalidRequest):
        usage_range(DAY, DAY + datetime.timedelta(days=92))
