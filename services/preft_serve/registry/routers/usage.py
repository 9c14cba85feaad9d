"""Tenant endpoint for the usage the gateway counted: per day and model, or broken down
per model, user, key or served adapter version and per day or hour."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from preft_serve.common.domain_errors import InvalidRequest
from preft_serve.common.errors import error_responses
from preft_serve.common.usage_breakdown import HOURLY_DAYS, NAMED_PER_BUCKET
from preft_serve.common.usage_wire import By, GroupBy, UsageReport
from preft_serve.registry.audit import TIME_PATTERN
from preft_serve.registry.deps import PrincipalDep, UsageDep
from preft_serve.registry.usage import (
    DAY_PATTERN,
    DEFAULT_DAYS,
    DEFAULT_HOURS,
    MAX_DAYS,
    MAX_HOURS,
    breakdown_range,
    parse_day,
    usage_range,
)

router = APIRouter(prefix="/v1/usage", tags=["usage"])
DESCRIPTION = (
    "Your requests and tokens as the gateway counted them (buckets without any are left "
    f"out). With `start`/`end` (or nothing): per UTC day and model, at most {MAX_DAYS} days. "
    "With `group_by`, `by`, `since` or `until`: a breakdown per model, user, key or served "
    "adapter version (`by=version`: `name@version`, with the errors after the version was "
    "chosen and the time to first token of streamed requests), per UTC "
    f"day (at most {MAX_DAYS} at once) or hour (the last {HOURLY_DAYS} days are kept, at most "
    f"{MAX_HOURS} hours at once). Each day and each hour counts its first {NAMED_PER_BUCKET} "
    "users (keys) by name and the rest together as `other`."
)
_TIME = "RFC 3339 (2026-01-31T12:00:00Z, an offset, or a date) or unix seconds"


@router.get(
    "",
    response_model=UsageReport,
    response_model_exclude_none=True,
    description=DESCRIPTION,
    responses=error_responses(400, 401, 403, 422),
)
def get_usage(
    principal: PrincipalDep,
    usage: UsageDep,
    start: Annotated[
        str | None,
        Query(
            pattern=DAY_PATTERN,
            description=f"Per-day report: first UTC day (YYYY-MM-DD), included; default: "
            f"{DEFAULT_DAYS - 1} days before end",
        ),
    ] = None,
    end: Annotated[
        str | None,
        Query(
            pattern=DAY_PATTERN,
            description="Per-day report: last UTC day (YYYY-MM-DD), included; default: "
            f"today, or start + {DEFAULT_DAYS - 1} days",
        ),
    ] = None,
    group_by: Annotated[
        GroupBy | None,
        Query(description="Breakdown: one bucket per UTC day (default) or hour"),
    ] = None,
    by: Annotated[
        By | None,
        Query(
            description="Breakdown: counts per model (default), user id, key id or the "
            "adapter version that served (name@version)"
        ),
    ] = None,
    since: Annotated[
        str | None,
        Query(
            description=f"Breakdown: from the bucket holding this time: {_TIME}; default: "
            f"{DEFAULT_DAYS} days (group_by=hour: {DEFAULT_HOURS} hours) up to until",
            json_schema_extra={"pattern": TIME_PATTERN},
        ),
    ] = None,
    until: Annotated[
        str | None,
        Query(
            description=f"Breakdown: to the bucket holding this time, included: {_TIME}; "
            "default: now",
            json_schema_extra={"pattern": TIME_PATTERN},
        ),
    ] = None,
) -> UsageReport:
    if group_by is None and by is None and since is None and until is None:
        first, last = usage_range(parse_day(start, "start"), parse_day(end, "end"))
        return usage.report(principal.tenant, first, last)
    if start is not None or end is not None:
        raise InvalidRequest(
            "start/end go with the per-day report; with group_by or by give since/until",
            param="start" if start is not None else "end",
        )
    buckets = breakdown_range(group_by or "day", since, until)
    return usage.breakdown(principal.tenant, buckets, by or "model")
