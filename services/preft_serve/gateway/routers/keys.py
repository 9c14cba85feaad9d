"""The registry's API key routes for a tenant's own keys, forwarded
(``gateway.registry_proxy``), with whatever else it serves under ``/v1/keys``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from preft_serve.common.errors import error_responses
from preft_serve.gateway.deps import StateDep, TenantDep
from preft_serve.gateway.openapi import json_object_body, json_reply
from preft_serve.gateway.registry_proxy import forward
from preft_serve.gateway.routers.forwarded import FORWARD_ERRORS, forward_the_rest

router = APIRouter(prefix="/v1/keys", tags=["keys"])
KEY = json_reply("key_id, role, name, expiry, last use (never the secret)")


@router.post(
    "",
    status_code=201,
    openapi_extra=json_object_body(
        {
            "role": {"type": "string", "enum": ["admin", "developer", "inference"]},
            "name": {"type": "string"},
        },
        (),
        "The new key's role and name (the registry's document lists every field)",
    ),
    responses={
        **json_reply("The new key, its secret shown this once", 201),
        **error_responses(400, 408, 422, *FORWARD_ERRORS),
    },
)
async def create_key(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Issue another key of your tenant (rotation: create, switch clients, revoke)."""
    return await forward(state.registry_http, request, owner)


@router.get(
    "", responses={**json_reply("Your keys, oldest first"), **error_responses(*FORWARD_ERRORS)}
)
async def list_keys(request: Request, state: StateDep, owner: TenantDep) -> Response:
    return await forward(state.registry_http, request, owner)


@router.get("/{key_id}", responses={**KEY, **error_responses(400, 404, *FORWARD_ERRORS)})
async def get_key(key_id: str, request: Request, state: StateDep, owner: TenantDep) -> Response:
    return await forward(state.registry_http, request, owner)


@router.delete(
    "/{key_id}",
    status_code=204,
    responses={204: {"description": "Revoked"}, **error_responses(400, 404, 409, *FORWARD_ERRORS)},
)
async def revoke_key(key_id: str, request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Revoke a key of your tenant: refused everywhere within a second."""
    return await forward(state.registry_http, request, owner)


forward_the_rest(router)
