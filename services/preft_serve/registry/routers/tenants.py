"""Admin endpoints: tenants and their API keys (``Authorization: Bearer <admin token>``)."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from preft_serve.common.errors import error_responses
from preft_serve.common.tenant_limits import TenantLimits
from preft_serve.registry.deps import AdminDep, TenantsDep
from preft_serve.registry.models import (
    ApiKeyCreated,
    ApiKeyInfo,
    TenantCreate,
    TenantCreated,
    TenantDeleted,
    TenantOut,
    TenantSummary,
    TenantUpdate,
)
from preft_serve.registry.names import KeyIdPath, TenantPath

router = APIRouter(prefix="/v1/tenants", tags=["tenants (admin)"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TenantCreated,
             responses=error_responses(400, 401, 409))
def create_tenant(body: TenantCreate, _: AdminDep, tenants: TenantsDep) -> TenantCreated:
    """Create a tenant; the response carries its first API key, shown only this once.
    ``quota`` sets the tenant's own storage quotas (else the registry's defaults apply)."""
    tenant, key = tenants.create(body.name, body.quota)
    return TenantCreated(**tenant.model_dump(), api_key=key.api_key, key_id=key.key_id)


@router.get("", response_model=list[TenantSummary], responses=error_responses(401))
def list_tenants(_: AdminDep, tenants: TenantsDep) -> list[TenantSummary]:
    """Every tenant by name, with its number of adapters."""
    return tenants.list_tenants()


@router.delete("/{tenant}", response_model=TenantDeleted, responses=error_responses(400, 401, 404))
def delete_tenant(tenant: TenantPath, _: AdminDep, tenants: TenantsDep) -> TenantDeleted:
    """Delete a tenant: its API keys stop working at once, its bindings, adapters and version
    histories are removed, and stored contents no other tenant references are deleted."""
    return tenants.delete(tenant)


@router.get("/{tenant}", response_model=TenantOut, responses=error_responses(400, 401, 404))
def get_tenant(tenant: TenantPath, _: AdminDep, tenants: TenantsDep) -> TenantOut:
    return tenants.get(tenant)


@router.patch("/{tenant}", response_model=TenantOut,
              responses=error_responses(400, 401, 404, 422))
def update_tenant(tenant: TenantPath, body: TenantUpdate, _: AdminDep,
                  tenants: TenantsDep) -> TenantOut:
    """Change the tenant's settings, a merge patch: its own storage quotas (``{"quota":
    {"max_adapters": 50}}`` sets one, ``null`` for a field goes back to the registry's
    default, ``"quota": null`` drops both; uploads are checked against them from the next
    one on, and what the tenant already stores is kept even when it is over the new quota)
    and ``unbound_user`` (``"not_found"``: a user without a binding who names the base model
    gets 404 instead of the base model's answer; ``null``: the default, ``"base_model"``)."""
    if not body.model_fields_set:
        return tenants.get(tenant)
    return tenants.update(tenant, body)


@router.get("/{tenant}/keys", response_model=list[ApiKeyInfo],
            responses=error_responses(400, 401, 404))
def list_keys(tenant: TenantPath, _: AdminDep, tenants: TenantsDep) -> list[ApiKeyInfo]:
    tenants.get(tenant)
    return tenants.list_keys(tenant)


@router.post("/{tenant}/keys", status_code=status.HTTP_201_CREATED, response_model=ApiKeyCreated,
             responses=error_responses(400, 401, 404))
def create_key(tenant: TenantPath, _: AdminDep, tenants: TenantsDep) -> ApiKeyCreated:
    """Issue another key (rotation: create, switch clients, then revoke the old one)."""
    return tenants.create_key(tenant)


@router.delete("/{tenant}/keys/{key_id}", status_code=status.HTTP_204_NO_CONTENT,
               responses=error_responses(400, 401, 404))
def revoke_key(tenant: TenantPath, key_id: KeyIdPath, _: AdminDep, tenants: TenantsDep) -> Response:
    tenants.revoke_key(tenant, key_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{tenant}/limits", response_model=TenantLimits,
            responses=error_responses(400, 401, 404))
def get_limits(tenant: TenantPath, _: AdminDep, tenants: TenantsDep) -> TenantLimits:
    """The tenant's rate-limit overrides (null fields use the gateway's defaults)."""
    return tenants.get_limits(tenant)


@router.put("/{tenant}/limits", response_model=TenantLimits,
            responses=error_responses(400, 401, 404, 422))
def set_limits(tenant: TenantPath, body: TenantLimits, _: AdminDep,
               tenants: TenantsDep) -> TenantLimits:
    """Replace the tenant's rate-limit overrides; gateways apply them within
    ``PREFT_GATEWAY_LIMITS_CACHE_S`` seconds."""
    return tenants.set_limits(tenant, body)
