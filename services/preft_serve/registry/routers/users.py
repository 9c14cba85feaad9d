"""Tenant endpoints for user -> adapter bindings."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from preft_serve.common.audit_wire import AuditAction
from preft_serve.common.domain_errors import NotFound
from preft_serve.common.errors import error_responses
from preft_serve.registry.audit_deps import TenantAuditDep
from preft_serve.registry.bindings import BindingService
from preft_serve.registry.deps import BindingsDep, PrincipalDep
from preft_serve.registry.names import ADAPTER_PATTERN
from preft_serve.registry.routers.path_params import PageLimit, UserCursor, UserPath
from preft_serve.registry.schemas import BindingIn, BindingOut, UserPage

router = APIRouter(prefix="/v1/users", tags=["users"])


def _bound_to(bindings: BindingService, tenant: str, user: str) -> str | None:
    """The adapter ``user`` is bound to now (for the audit log's ``before``)."""
    try:
        return bindings.get(tenant, user).adapter
    except NotFound:
        return None


@router.get("", response_model=UserPage, responses=error_responses(400, 401, 403, 404))
def list_users(
    principal: PrincipalDep,
    bindings: BindingsDep,
    limit: PageLimit = 100,
    cursor: UserCursor = None,
    adapter: Annotated[
        str | None,
        Query(
            description="Only the users bound to this adapter (a page then reads at most "
            "ten times limit users, so it may hold fewer than limit before the last)",
            json_schema_extra={"pattern": ADAPTER_PATTERN},
        ),
    ] = None,
) -> UserPage:
    """Your bound users and their adapters, a page at a time by user id."""
    items, next_cursor = bindings.list(principal.tenant, limit, cursor, adapter)
    return UserPage(items=items, next_cursor=next_cursor)


@router.put("/{user_id}", response_model=BindingOut, responses=error_responses(400, 401, 403, 404))
def bind_user(
    user_id: UserPath,
    body: BindingIn,
    principal: PrincipalDep,
    bindings: BindingsDep,
    audit: TenantAuditDep,
) -> BindingOut:
    """Bind a user to one of your adapters (replaces any previous binding)."""
    before = _bound_to(bindings, principal.tenant, user_id)
    bound = bindings.bind(principal.tenant, user_id, body.adapter)
    if before != bound.adapter:
        audit(AuditAction.BINDING_SET, user_id, before=before, after=bound.adapter)
    return bound


@router.get("/{user_id}", response_model=BindingOut, responses=error_responses(400, 401, 403, 404))
def get_binding(user_id: UserPath, principal: PrincipalDep, bindings: BindingsDep) -> BindingOut:
    return bindings.get(principal.tenant, user_id)


@router.delete(
    "/{user_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=error_responses(400, 401, 403, 404),
)
def unbind_user(
    user_id: UserPath, principal: PrincipalDep, bindings: BindingsDep, audit: TenantAuditDep
) -> Response:
    """Remove the binding; the user's requests then run on the base model."""
    before = _bound_to(bindings, principal.tenant, user_id)
    bindings.unbind(principal.tenant, user_id)
    audit(AuditAction.BINDING_DELETE, user_id, before=before)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
