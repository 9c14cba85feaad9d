"""GET /v1/usage with an ``until`` at the calendar's end: the last bucket would end in year
10000, which no datetime can hold, so such a range is a 400 saying what to send (it was a
500); a range ending the day before still answers."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

FAR = [
    {"by": "version", "until": "9999-12-31"},
    {"by": "version", "until": "253402300799"},
    {"group_by": "hour", "until": "9999-12-31T23:30:00Z"},
]


@pytest.mark.parametrize("params", FAR, ids=lambda p: p["until"])
def test_an_until_on_the_calendars_last_day_is_a_400(
    client: TestClient, acme: dict[str, str], params: dict[str, Any]
) -> None:
    resp = client.get("/v1/usage", params=params, headers=acme)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "invalid_value"
    assert error["param"] == "until"
    assert error["message"].startswith("until must be before 9999-12-31"), error


@pytest.mark.parametrize("group_by", ["day", "hour"])
def test_a_range_ending_the_day_before_still_answers(
    client: TestClient, acme: dict[str, str], group_by: str
) -> None:
    resp = client.get(
        "/v1/usage",
        params={"group_by": group_by, "by": "version", "until": "9999-12-30T23:59:59Z"},
        headers=acme,
    )
    assert resp.status_code == 200, resp.text
    report = resp.json()
    assert report["until"] == "9999-12-31T00:00:00Z"
    assert report["buckets"] == []


def test_an_ordinary_range_still_answers(client: TestClient, acme: dict[str, str]) -> None:
    resp = client.get(
        "/v1/usage",
        params={"by": "version", "since": "2026-03-01", "until": "2026-03-07"},
        headers=acme,
    )
    assert resp.status_code == 200, resp.text
    report = resp.json()
    assert (report["since"], report["until"]) == ("2026-03-01T00:00:00Z", "2026-03-08T00:00:00Z")
