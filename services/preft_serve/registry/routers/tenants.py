"""Admin endpoints: tenants and their API keys (``Authorization: Bearer <admin token>``)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Response, status

from preft_serve.common.audit_wire import AuditAction
from preft_serve.common.errors import error_responses
from preft_serve.common.tenant_rate_limits import TenantRateLimits
from preft_serve.registry.api_keys import key_spec
from preft_serve.registry.audit_deps import OperatorAuditDep
from preft_serve.registry.deps import AdminDep, TenantsDep
from preft_serve.registry.routers.path_params import KeyIdPath, TenantPath
from preft_serve.registry.schemas import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyInfo,
    TenantCreate,
    TenantCreated,
    TenantDeleted,
    TenantOut,
    TenantSummary,
    TenantUpdate,
)

router = APIRouter(prefix="/v1/tenants", tags=["tenants (admin)"])


def _settings_json(tenant: TenantOut | TenantRateLimits) -> str:
    """A tenant's settings for the audit log, as compact JSON without unset fields."""
    if isinstance(tenant, TenantOut):
        return tenant.model_dump_json(include={"quota", "unbound_user"}, exclude_none=True)
    return tenant.model_dump_json(exclude_none=True)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=TenantCreated,
    responses=error_responses(400, 401, 409),
)
def create_tenant(
    body: TenantCreate, _: AdminDep, tenants: TenantsDep, audit: OperatorAuditDep
) -> TenantCreated:
    """Create a tenant; the response carries its first API key, shown only this once.
    ``quota`` sets the tenant's own storage quotas (else the registry's defaults apply)."""
    tenant, key = tenants.create(body.name, body.quota)
    audit(AuditAction.TENANT_CREATE, body.name, after=key.key_id, tenant=body.name)
    return TenantCreated(**tenant.model_dump(), api_key=key.api_key, key_id=key.key_id)


MAX_TENANT_PAGE = 1000


@router.get("", response_model=list[TenantSummary], responses=error_responses(401, 422))
def list_tenants(
    _: AdminDep,
    tenants: TenantsDep,
    response: Response,
    limit: Annotated[
        int, Query(ge=1, le=MAX_TENANT_PAGE, description="Most tenants in this answer")
    ] = MAX_TENANT_PAGE,
    after: Annotated[
        str | None,
        Query(max_length=64, description="List the tenants whose names sort after this one"),
    ] = None,
) -> list[TenantSummary]:
    """Tenants by name, with their number of adapters and quotas, a page at a time: when
    more follow, the ``Link`` header's ``rel="next"`` URL lists them (RFC 8288)."""
    page, next_after = tenants.list_tenants(limit, after)
    if next_after is not None:
        query = urlencode({"limit": limit, "after": next_after})
        response.headers["Link"] = f'</v1/tenants?{query}>; rel="next"'
    return page


@router.delete("/{tenant}", response_model=TenantDeleted, responses=error_responses(400, 401, 404))
def delete_tenant(
    tenant: TenantPath, _: AdminDep, tenants: TenantsDep, audit: OperatorAuditDep
) -> TenantDeleted:
    """Delete a tenant: its API keys stop working at once, its bindings, adapters and version
    histories are removed, and stored contents no other tenant references are deleted."""
    deleted = tenants.delete(tenant)
    audit(AuditAction.TENANT_DELETE, tenant, tenant=tenant, reset=True)
    return deleted


@router.get("/{tenant}", response_model=TenantOut, responses=error_responses(400, 401, 404))
def get_tenant(tenant: TenantPath, _: AdminDep, tenants: TenantsDep) -> TenantOut:
    return tenants.get(tenant)


@router.patch("/{tenant}", response_model=TenantOut, responses=error_responses(400, 401, 404, 422))
def update_tenant(
    tenant: TenantPath,
    body: TenantUpdate,
    _: AdminDep,
    tenants: TenantsDep,
    audit: OperatorAuditDep,
) -> TenantOut:
    """Change the tenant's settings, a merge patch: its own storage quotas (``{"quota":
    {"max_adapters": 50}}`` sets one, ``null`` for a field goes back to the registry's
    default, ``"quota": null`` drops both; uploads are checked against them from the next
    one on, and what the tenant already stores is kept even when it is over the new quota)
    and ``unbound_user`` (``"not_found"``: a user without a binding who names the base model
    gets 404 instead of the base model's answer; ``null``: the default, ``"base_model"``)."""
    before = tenants.get(tenant)
    if not body.model_fields_set:
        return before
    after = tenants.update(tenant, body)
    audit(
        AuditAction.TENANT_UPDATE,
        tenant,
        before=_settings_json(before),
        after=_settings_json(after),
        tenant=tenant,
    )
    return after


@router.get(
    "/{tenant}/keys", response_model=list[ApiKeyInfo], responses=error_responses(400, 401, 404)
)
def list_keys(tenant: TenantPath, _: AdminDep, tenants: TenantsDep) -> list[ApiKeyInfo]:
    tenants.get(tenant)
    return tenants.list_keys(tenant)


@router.post(
    "/{tenant}/keys",
    status_code=status.HTTP_201_CREATED,
    response_model=ApiKeyCreated,
    responses=error_responses(400, 401, 404, 422),
)
def create_key(
    tenant: TenantPath,
    _: AdminDep,
    tenants: TenantsDep,
    audit: OperatorAuditDep,
    body: ApiKeyCreate | None = None,
) -> ApiKeyCreated:
    """Issue another key (rotation: create, switch clients, then revoke the old one).
    Without a body: an admin key that does not expire; with one, its role, name and
    expiry as for ``POST /v1/keys``."""
    spec = key_spec(body, dt.datetime.now(dt.UTC)) if body is not None else None
    created = tenants.create_key(tenant, spec)
    audit(AuditAction.KEY_CREATE, created.key_id, after=created.key_id, tenant=tenant)
    return created


@router.delete(
    "/{tenant}/keys/{key_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=error_responses(400, 401, 404),
)
def revoke_key(
    tenant: TenantPath, key_id: KeyIdPath, _: AdminDep, tenants: TenantsDep, audit: OperatorAuditDep
) -> Response:
    tenants.revoke_key(tenant, key_id)
    audit(AuditAction.KEY_REVOKE, key_id, before=key_id, tenant=tenant)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/{tenant}/limits", response_model=TenantRateLimits, responses=error_responses(400, 401, 404)
)
def get_limits(tenant: TenantPath, _: AdminDep, tenants: TenantsDep) -> TenantRateLimits:
    """The tenant's rate-limit overrides (null fields use the gateway's defaults)."""
    return tenants.get_rate_limits(tenant)


@router.put(
    "/{tenant}/limits",
    response_model=TenantRateLimits,
    responses=error_responses(400, 401, 404, 422),
)
def set_limits(
    tenant: TenantPath,
    body: TenantRateLimits,
    _: AdminDep,
    tenants: TenantsDep,
    audit: OperatorAuditDep,
) -> TenantRateLimits:
    """Replace the tenant's rate-limit overrides; gateways apply them within
    ``PREFT_GATEWAY_LIMITS_CACHE_S`` seconds."""
    before = tenants.get_rate_limits(tenant)
    after = tenants.set_rate_limits(tenant, body)
    audit(
        AuditAction.TENANT_RATE_LIMITS,
        tenant,
        before=_settings_json(before),
        after=_settings_json(after),
        tenant=tenant,
    )
    return after
