"""The registry's user bindings (user id -> adapter), forwarded (``gateway.registry_proxy``),
with whatever else it serves under ``/v1/users``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from preft_serve.common.errors import error_responses
from preft_serve.gateway.deps import StateDep, TenantDep
from preft_serve.gateway.openapi import json_object_body, json_reply, typed_query
from preft_serve.gateway.registry_proxy import forward
from preft_serve.gateway.routers.forwarded import FORWARD_ERRORS, forward_the_rest

router = APIRouter(prefix="/v1/users", tags=["users"])
BINDING = json_reply("user, adapter, and the version it runs")


@router.get(
    "",
    openapi_extra=typed_query(
        limit=("integer", "At most this many (1-1000, default 100)"),
        cursor=("string", "next_cursor of the previous page (a user id)"),
        adapter=("string", "Only the users bound to this adapter"),
    ),
    responses={
        **json_reply("items (user and adapter) and next_cursor"),
        **error_responses(400, 404, *FORWARD_ERRORS),
    },
)
async def list_users(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Your bound users and their adapters, by user id, a page at a time."""
    return await forward(state.registry_http, request, owner)


@router.put(
    "/{user_id}",
    openapi_extra=json_object_body(
        {"adapter": {"type": "string", "description": "One of your adapters"}},
        ("adapter",),
        "The adapter the user's requests run on",
    ),
    responses={**BINDING, **error_responses(400, 404, 408, 422, *FORWARD_ERRORS)},
)
async def bind_user(user_id: str, request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Bind a user to one of your adapters (replaces any previous binding)."""
    return await forward(state.registry_http, request, owner)


@router.get("/{user_id}", responses={**BINDING, **error_responses(400, 404, *FORWARD_ERRORS)})
async def get_binding(
    user_id: str, request: Request, state: StateDep, owner: TenantDep
) -> Response:
    return await forward(state.registry_http, request, owner)


@router.delete(
    "/{user_id}",
    status_code=204,
    responses={204: {"description": "Unbound"}, **error_responses(400, 404, *FORWARD_ERRORS)},
)
async def unbind_user(
    user_id: str, request: Request, state: StateDep, owner: TenantDep
) -> Response:
    """Remove the binding; the user's requests then run on the base model."""
    return await forward(state.registry_http, request, owner)


forward_the_rest(router)
