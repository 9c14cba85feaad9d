"""Wire models of ``GET /v1/usage``: the per day x model report, and the breakdowns (per
model, user, key or served adapter version; per day or hour). The registry answers with
them; the gateway, which forwards the route, documents it with them."""

from __future__ import annotations

import datetime
from typing import Literal

from pydantic import BaseModel, Field

GroupBy = Literal["day", "hour"]
By = Literal["model", "user", "key", "version"]


class UsageModel(BaseModel):
    model: str = Field(description="The adapter's name, or the base model's public name")
    requests: int = Field(description="Requests a worker answered with 200")
    prompt_tokens: int
    completion_tokens: int


class UsageDay(BaseModel):
    date: datetime.date = Field(description="The UTC day")
    models: list[UsageModel]


class UsageCounts(BaseModel):
    requests: int = Field(description="Requests a worker answered with 200")
    prompt_tokens: int
    completion_tokens: int


class UsageItem(UsageCounts):
    name: str = Field(
        description="The model (adapter or base model), user id or key id; by=version: "
        "the adapter version that served, name@version (the base model: its name)"
    )
    errors: int | None = Field(
        None,
        description="by=version: requests that ended in an error (status 400 or more) "
        "after the version was chosen; not among requests",
    )
    ttft_count: int | None = Field(
        None, description="by=version: streamed requests whose time to first token is known"
    )
    ttft_seconds_sum: float | None = Field(
        None, description="by=version: their times to first token, summed (seconds)"
    )
    ttft_seconds_mean: float | None = Field(
        None, description="by=version: ttft_seconds_sum / ttft_count (absent when none)"
    )


class UsageBucket(BaseModel):
    start: datetime.datetime = Field(description="Start of the UTC day or hour")
    items: list[UsageItem] = Field(description="Counted by name, most requests first")
    no_user: UsageCounts | None = Field(
        None, description="by=user: requests that named no user (absent when none)"
    )
    other: UsageCounts | None = Field(
        None,
        description="by=user or key: the users (keys) past the bucket's bound on names, "
        "together (absent when none)",
    )


class UsageBounds(BaseModel):
    """What the breakdowns keep; documented with every breakdown so a client knows."""

    named_per_bucket: int = Field(
        description="Users (keys) counted under their own name per day or hour: the first "
        "ones seen in it; later ones are counted under other"
    )
    hourly_days: int = Field(description="Days hourly buckets are kept")
    max_days: int = Field(description="Most days one group_by=day query covers")
    max_hours: int = Field(description="Most hours one group_by=hour query covers")


class UsageReport(BaseModel):
    """Asked with ``start``/``end`` (or nothing): ``start``, ``end`` and ``days``. Asked with
    any of ``group_by``, ``by``, ``since``, ``until``: the breakdown fields instead."""

    tenant: str
    start: datetime.date | None = None
    end: datetime.date | None = None
    days: list[UsageDay] | None = Field(None, description="Days with any usage, oldest first")
    group_by: GroupBy | None = None
    by: By | None = None
    since: datetime.datetime | None = Field(None, description="Start of the first bucket")
    until: datetime.datetime | None = Field(None, description="End of the last bucket")
    buckets: list[UsageBucket] | None = Field(
        None, description="Buckets with any usage, oldest first"
    )
    bounds: UsageBounds | None = None
