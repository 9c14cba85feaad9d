"""The tenant's usage, forwarded to the registry (``gateway.registry_proxy``), which reads
what the gateways counted: per day and model, or per model, user or key and day or hour."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from preft_serve.common.errors import error_responses
from preft_serve.common.usage_wire import UsageReport
from preft_serve.gateway.deps import StateDep, TenantDep
from preft_serve.gateway.openapi import typed_query
from preft_serve.gateway.registry_proxy import forward
from preft_serve.gateway.routers.forwarded import FORWARD_ERRORS, forward_the_rest

router = APIRouter(prefix="/v1/usage", tags=["usage"])
TIME = "RFC 3339 or unix seconds"


@router.get(
    "",
    response_model=UsageReport,
    response_model_exclude_none=True,
    openapi_extra=typed_query(
        start=("string", "Per-day report: first UTC day (YYYY-MM-DD)"),
        end=("string", "Per-day report: last UTC day (YYYY-MM-DD)"),
        group_by=("string", "Breakdown: day (default) or hour"),
        by=("string", "Breakdown: model (default), user, key or version (name@version)"),
        since=("string", f"Breakdown: from the bucket holding this time ({TIME})"),
        until=("string", f"Breakdown: to the bucket holding this time ({TIME}); default now"),
    ),
    responses=error_responses(400, 422, *FORWARD_ERRORS),
)
async def get_usage(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Your requests and tokens as the gateways counted them. With ``start``/``end`` (or
    nothing): per UTC day and model, at most 92 days. With ``group_by``, ``by``, ``since``
    or ``until``: per model, user or key, per UTC day (at most 92) or hour (the last 7 days
    are kept, at most 168 hours at once); each day and hour counts its first 100 users
    (keys) by name and the rest together as ``other``."""
    return await forward(state.registry_http, request, owner)


forward_the_rest(router)
