"""The tenant's audit log, forwarded to the registry (``gateway.registry_proxy``), so the
base URL a tenant uses for everything else also says who changed what."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from preft_serve.common.audit_wire import AuditPage
from preft_serve.common.errors import error_responses
from preft_serve.gateway.deps import StateDep, TenantDep
from preft_serve.gateway.openapi import query
from preft_serve.gateway.registry_proxy import forward
from preft_serve.gateway.routers.files import FORWARD_ERRORS

router = APIRouter(prefix="/v1/audit", tags=["audit"])


@router.get(
    "",
    response_model=AuditPage,
    openapi_extra=query("since", "until", "actor", "action", "limit", "after"),
    responses=error_responses(400, *FORWARD_ERRORS),
)
async def read_audit_log(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Who changed what in your tenant: adapters, bindings, keys, files and fine-tuning
    jobs, with the acting key id, before and after. ``since``/``until``: RFC 3339 or unix
    seconds; go on with ``after=next_cursor`` while it is set."""
    return await forward(state.registry_http, request, owner)
