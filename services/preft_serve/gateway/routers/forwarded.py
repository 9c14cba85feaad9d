"""Forward everything under a registry prefix, documented or not.

A router of forwarded routes documents each of the registry's routes it knows of; these
catch-alls (left out of the document) forward the rest of the prefix, so a route the
registry adds under it, or another method on a documented path, reaches the registry
(which answers it, or says 404/405) without a gateway release.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from preft_serve.gateway.deps import StateDep, TenantDep
from preft_serve.gateway.registry_proxy import forward

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
# No or bad key; over the tenant's share of registry calls; no registry; registry down or
# busy. (403: a key whose role does not allow the route, said by the registry.)
FORWARD_ERRORS = (401, 403, 429, 501, 503)


def forward_the_rest(router: APIRouter) -> APIRouter:
    """Add catch-alls for the router's prefix and everything under it; call it after the
    documented routes, so they match first."""

    async def rest(request: Request, state: StateDep, owner: TenantDep) -> Response:
        return await forward(state.registry_http, request, owner)

    router.add_api_route("", rest, methods=METHODS, include_in_schema=False)
    router.add_api_route("/{rest:path}", rest, methods=METHODS, include_in_schema=False)
    return router
