"""A tenant's per-day usage, as the gateway counts it (``RegistryKeys.usage``)."""

from __future__ import annotations

import datetime

import redis

from preft_serve.common.domain_errors import InvalidRequest
from preft_serve.common.registry_client import RegistryKeys, parse_usage
from preft_serve.registry.schemas import UsageDay, UsageModel, UsageReport

DEFAULT_DAYS = 7
MAX_DAYS = 92
DAY_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"


def parse_day(value: str | None, name: str) -> datetime.date | None:
    if value is None:
        return None
    try:
        return datetime.date.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(f"{name} {value!r} is not a date (YYYY-MM-DD)") from None


def usage_range(
    start: datetime.date | None, end: datetime.date | None, today: datetime.date | None = None
) -> tuple[datetime.date, datetime.date]:
    """The days asked for, both ends included: default the last ``DEFAULT_DAYS`` up to
    today (UTC); at most ``MAX_DAYS``."""
    today = today or datetime.datetime.now(datetime.UTC).date()
    try:
        end = end or (
            today
            if start is None
            else min(today, start + datetime.timedelta(days=DEFAULT_DAYS - 1))
        )
        start = start or end - datetime.timedelta(days=DEFAULT_DAYS - 1)
    except OverflowError:  # start near 9999-12-31, or end near 0001-01-01
        raise InvalidRequest(
            f"the range from {start or '...'} to {end or '...'} reaches past the "
            "calendar (years 1-9999); give both start and end"
        ) from None
    if start > end:
        raise InvalidRequest(f"start {start} is after end {end}")
    days = (end - start).days + 1
    if days > MAX_DAYS:
        raise InvalidRequest(
            f"the range {start}..{end} spans {days} days; at most {MAX_DAYS} "
            "may be asked for at once"
        )
    return start, end


class UsageService:
    def __init__(self, client: redis.Redis, keys: RegistryKeys) -> None:
        self.redis, self.keys = client, keys

    def report(self, tenant: str, start: datetime.date, end: datetime.date) -> UsageReport:
        days = [start + datetime.timedelta(days=i) for i in range((end - start).days + 1)]
        pipe = self.redis.pipeline(transaction=False)
        for day in days:
            pipe.hgetall(self.keys.usage(tenant, day.strftime("%Y%m%d")))
        found = []
        for day, raw in zip(days, pipe.execute(), strict=True):
            models = parse_usage(raw)
            if models:
                found.append(
                    UsageDay(
                        date=day,
                        models=[
                            UsageModel(model=name, **counts)
                            for name, counts in sorted(models.items())
                        ],
                    )
                )
        return UsageReport(tenant=tenant, start=start, end=end, days=found)
