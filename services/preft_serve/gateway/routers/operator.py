"""The operator's routes (``Authorization: Bearer <admin token>``): this gateway's workers
and routing, and the registry's tenants and quotas, read through the gateway.

Read-only on purpose: the gateway is the public door, so creating or changing tenants
stays on the registry's own (internal) URL; here a leaked console session can read, not
write. A tenant's API key, whatever its role, gets 401 on every route here.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from preft_serve.common.errors import NotFound, error_responses
from preft_serve.common.registry_client import KeyOwner
from preft_serve.gateway.deps import StateDep
from preft_serve.gateway.operator import (
    MAX_PAGE,
    MAX_RESIDENT,
    AdminDep,
    Pool,
    RoutingView,
    WorkerPage,
    routing_view,
    worker_page,
)
from preft_serve.gateway.registry_proxy import forward

router = APIRouter(tags=["operator (admin)"])
# The slot key operator calls to the registry take (no tenant name can be this).
OPERATOR = KeyOwner(tenant="(operator)", key_id="admin")


@router.get(
    "/v1/operator/workers", response_model=WorkerPage, responses=error_responses(401, 404, 501)
)
async def list_workers(
    _: AdminDep,
    state: StateDep,
    pool: Annotated[Pool, Query(description="prefill (the adapters' pool) or decode")] = "prefill",
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    after: Annotated[str | None, Query(max_length=2048, description="`last` of a page")] = None,
    adapters: Annotated[
        int, Query(ge=0, le=MAX_RESIDENT, description="Most resident shas per worker")
    ] = 100,
) -> WorkerPage:
    """This gateway's view of a pool's workers, sorted by URL: health, load (its own
    requests in flight and the others' at the last poll) and the adapters each reported
    loaded, as of the pool monitor's last round. 404 for the decode pool when none is
    configured."""
    if pool == "decode":
        if state.decode_pool is None:
            raise NotFound("this gateway has no decode pool", code="no_decode_pool")
        return worker_page(state.decode_pool, pool, limit, after, adapters)
    return worker_page(state.pool, pool, limit, after, adapters)


@router.get("/v1/operator/routing", response_model=RoutingView, responses=error_responses(401, 501))
async def routing(_: AdminDep, state: StateDep) -> RoutingView:
    """This gateway's routing decisions since it started (the warm-hit share: requests
    sent to a worker that had the adapter loaded) and its handoffs to the decode pool."""
    return routing_view(state.metrics, state.decode_pool is not None, state.started_at)


async def _tenants(request: Request, _: AdminDep, state: StateDep) -> Response:
    return await forward(state.registry_http, request, OPERATOR)


_TENANT_READS = {
    "/v1/tenants": "List tenants with their adapter counts and storage quotas",
    "/v1/tenants/{tenant}": "A tenant: its settings, quotas and API keys (no secrets)",
    "/v1/tenants/{tenant}/limits": "A tenant's rate-limit overrides",
    "/v1/tenants/{tenant}/keys": "A tenant's API keys (ids, names, roles; no secrets)",
}
for _path, _summary in _TENANT_READS.items():
    router.add_api_route(
        _path,
        _tenants,
        methods=["GET"],
        summary=_summary,
        description="Forwarded to the registry as it came, admin token included.",
        responses=error_responses(401, 404, 501, 503),
    )
