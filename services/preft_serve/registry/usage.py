"""A tenant's usage, as the gateway counts it: per day and model (``RegistryKeys.usage``),
and broken down per model, user, key or served adapter version, per day or hour
(``common.usage_breakdown``)."""

from __future__ import annotations

import dataclasses
import datetime
import time

import redis

from preft_serve.common.domain_errors import InvalidRequest
from preft_serve.common.registry_client import RegistryKeys, parse_usage
from preft_serve.common.usage_breakdown import (
    HOURLY_DAYS,
    NAMED_PER_BUCKET,
    NO_USER,
    OTHER,
    day_key,
    hour_key,
    parse_versions,
)
from preft_serve.common.usage_wire import (
    By,
    GroupBy,
    UsageBounds,
    UsageBucket,
    UsageCounts,
    UsageDay,
    UsageItem,
    UsageModel,
    UsageReport,
)
from preft_serve.registry.audit import parse_time

DEFAULT_DAYS = 7
MAX_DAYS = 92
DEFAULT_HOURS = 24
MAX_HOURS = HOURLY_DAYS * 24
BOUNDS = UsageBounds(
    named_per_bucket=NAMED_PER_BUCKET,
    hourly_days=HOURLY_DAYS,
    max_days=MAX_DAYS,
    max_hours=MAX_HOURS,
)
_STEP = {"day": 86_400, "hour": 3_600}
# 9999-12-31T00:00:00Z: the latest ``until`` whose last bucket (a day or an hour) ends
# within the calendar; ``datetime`` has no year 10000.
LATEST_UNTIL = 253_402_214_400
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


@dataclasses.dataclass(frozen=True)
class Buckets:
    """The buckets a breakdown covers: ``count`` of ``group_by``, the first at ``first``
    (unix seconds, a multiple of the bucket's length)."""

    group_by: GroupBy
    first: int
    count: int

    @property
    def step(self) -> int:
        return _STEP[self.group_by]

    def starts(self) -> list[datetime.datetime]:
        return [
            datetime.datetime.fromtimestamp(self.first + i * self.step, datetime.UTC)
            for i in range(self.count)
        ]


def breakdown_range(
    group_by: GroupBy, since: str | None, until: str | None, now: float | None = None
) -> Buckets:
    """The buckets from the one holding ``since`` to the one holding ``until`` (RFC 3339
    or unix seconds), both included. Defaults: ``until`` now; ``since`` the last
    ``DEFAULT_DAYS`` days, or ``DEFAULT_HOURS`` hours, up to ``until``. At most ``MAX_DAYS``
    days or ``MAX_HOURS`` hours, and hours no older than the ``HOURLY_DAYS`` they are kept."""
    now = time.time() if now is None else now
    step = _STEP[group_by]
    last_t = parse_time(until, "until") if until is not None else now
    if last_t >= LATEST_UNTIL:  # the last bucket's end would fall in year 10000
        raise InvalidRequest(
            "until must be before 9999-12-31: the range's end has to lie within the "
            "calendar (years 1-9999); give an earlier until",
            param="until",
        )
    default = DEFAULT_DAYS if group_by == "day" else DEFAULT_HOURS
    last = int(last_t // step * step)
    first = int(parse_time(since, "since") // step * step) if since is not None else None
    if since is not None and parse_time(since, "since") > last_t:
        raise InvalidRequest(
            "'since' is after 'until': swap them or widen the range", param="since"
        )
    if first is None:
        first = max(0, last - (default - 1) * step)
    if group_by == "hour":
        oldest = int(now // step * step) - (MAX_HOURS - 1) * step
        if first < oldest:
            kept = datetime.datetime.fromtimestamp(oldest, datetime.UTC)
            raise InvalidRequest(
                f"hourly usage is kept {HOURLY_DAYS} days: give a since at or after "
                f"{kept:%Y-%m-%dT%H:00:00Z}, or group_by=day for older usage",
                param="since",
            )
    count = (last - first) // step + 1
    unit, most = ("days", MAX_DAYS) if group_by == "day" else ("hours", MAX_HOURS)
    if count > most:
        raise InvalidRequest(
            f"the range spans {count} {unit}; at most {most} {unit} may be asked for at "
            "once with group_by=" + group_by + ": narrow since/until",
            param="since",
        )
    return Buckets(group_by, first, count)


def _item(name: str, counts: dict[str, int]) -> UsageItem:
    """One name's counts; a version's with its errors and time to first token."""
    if "errors" not in counts:
        return UsageItem(name=name, **counts)
    ttft_count, ttft_us = counts["ttft_count"], counts["ttft_us_sum"]
    return UsageItem(
        name=name,
        requests=counts["requests"],
        prompt_tokens=counts["prompt_tokens"],
        completion_tokens=counts["completion_tokens"],
        errors=counts["errors"],
        ttft_count=ttft_count,
        ttft_seconds_sum=ttft_us / 1e6,
        ttft_seconds_mean=ttft_us / 1e6 / ttft_count if ttft_count else None,
    )


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

    def breakdown(self, tenant: str, buckets: Buckets, by: By) -> UsageReport:
        """Counts per ``by`` in each bucket that has any, most requests first; the users
        (keys) past the bucket's bound together under ``other``."""
        starts = buckets.starts()
        pipe = self.redis.pipeline(transaction=False)
        for start in starts:
            if buckets.group_by == "day":
                pipe.hgetall(day_key(self.keys, tenant, f"{start:%Y%m%d}", by))
            else:
                pipe.hgetall(hour_key(self.keys, tenant, f"{start:%Y%m%d%H}", by))
        found = []
        for start, raw in zip(starts, pipe.execute(), strict=True):
            counts = parse_versions(raw) if by == "version" else parse_usage(raw)
            if not counts:
                continue
            other, no_user = counts.pop(OTHER, None), counts.pop(NO_USER, None)
            items = sorted(
                (_item(name, c) for name, c in counts.items()),
                key=lambda item: (-item.requests, item.name),
            )
            found.append(
                UsageBucket(
                    start=start,
                    items=items,
                    other=UsageCounts(**other) if other else None,
                    no_user=UsageCounts(**no_user) if no_user else None,
                )
            )
        until = datetime.datetime.fromtimestamp(
            buckets.first + buckets.count * buckets.step, datetime.UTC
        )
        return UsageReport(
            tenant=tenant,
            group_by=buckets.group_by,
            by=by,
            since=starts[0],
            until=until,
            buckets=found,
            bounds=BOUNDS,
        )
