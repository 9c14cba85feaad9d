"""Tenant endpoint for the usage the gateway counted, per day and model."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from preft_serve.common.errors import error_responses
from preft_serve.registry.deps import PrincipalDep, UsageDep
from preft_serve.registry.schemas import UsageReport
from preft_serve.registry.usage import DAY_PATTERN, DEFAULT_DAYS, parse_day, usage_range

router = APIRouter(prefix="/v1/usage", tags=["usage"])


@router.get("", response_model=UsageReport, responses=error_responses(400, 401, 422))
def get_usage(
    principal: PrincipalDep,
    usage: UsageDep,
    start: Annotated[
        str | None,
        Query(
            pattern=DAY_PATTERN,
            description=f"First UTC day (YYYY-MM-DD), included; default: "
            f"{DEFAULT_DAYS - 1} days before end",
        ),
    ] = None,
    end: Annotated[
        str | None,
        Query(
            pattern=DAY_PATTERN,
            description="Last UTC day (YYYY-MM-DD), included; default: "
            f"today, or start + {DEFAULT_DAYS - 1} days",
        ),
    ] = None,
) -> UsageReport:
    """Your requests and tokens per UTC day and model (adapter or base model), as the
    gateway counted them (days without any are left out); at most 92 days at once."""
    first, last = usage_range(parse_day(start, "start"), parse_day(end, "end"))
    return usage.report(principal.tenant, first, last)
