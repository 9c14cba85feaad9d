"""A tenant's own API keys, managed with one of its admin keys (``Authorization: Bearer
<admin-role key>``; ``common.key_roles`` refuses the other roles with a 403)."""

from __future__ import annotations

import datetime as dt
import json

from fastapi import APIRouter, Response, status

from preft_serve.common.audit_wire import AuditAction
from preft_serve.common.errors import error_responses
from preft_serve.common.key_roles import InsufficientRole, at_least
from preft_serve.registry.api_keys import key_spec
from preft_serve.registry.audit_deps import TenantAuditDep
from preft_serve.registry.deps import PrincipalDep, StateDep, TenantsDep
from preft_serve.registry.routers.path_params import KeyIdPath
from preft_serve.registry.schemas import ApiKeyCreate, ApiKeyCreated, ApiKeyInfo

router = APIRouter(prefix="/v1/keys", tags=["keys"])


def _described(key: ApiKeyInfo) -> str:
    """What the audit log keeps of a key: never its secret or hash."""
    return json.dumps(
        {k: v for k, v in key.model_dump(include={"role", "name", "expires_at"}).items() if v}
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ApiKeyCreated,
    responses=error_responses(400, 401, 403, 409, 422),
)
def create_key(
    body: ApiKeyCreate,
    principal: PrincipalDep,
    tenants: TenantsDep,
    audit: TenantAuditDep,
    state: StateDep,
) -> ApiKeyCreated:
    """Issue a key for the caller's tenant; the response carries it, shown only this once
    (only its hash is stored). ``role`` may be at most the caller's own. A tenant holding
    ``PREFT_REGISTRY_TENANT_MAX_KEYS`` keys is refused (409 ``key_limit_reached``):
    revoke unused keys first."""
    spec = key_spec(body, dt.datetime.now(dt.UTC))
    if not at_least(principal.role, spec.role):
        raise InsufficientRole(
            f"this key's role '{principal.role.value}' cannot create a key with role "
            f"'{spec.role.value}': a key may create keys of its own role or lower"
        )
    created = tenants.create_key(
        principal.tenant,
        spec,
        created_by=principal.key_id,
        max_keys=state.settings.tenant_max_keys,
    )
    audit(AuditAction.KEY_CREATE, created.key_id, after=_described(created))
    return created


@router.get("", response_model=list[ApiKeyInfo], responses=error_responses(401, 403))
def list_keys(principal: PrincipalDep, tenants: TenantsDep) -> list[ApiKeyInfo]:
    """The tenant's keys, oldest first: role, name, expiry, last use; no secrets."""
    return tenants.list_keys(principal.tenant)


@router.get("/{key_id}", response_model=ApiKeyInfo, responses=error_responses(400, 401, 403, 404))
def get_key(key_id: KeyIdPath, principal: PrincipalDep, tenants: TenantsDep) -> ApiKeyInfo:
    return tenants.get_key(principal.tenant, key_id)


@router.delete(
    "/{key_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=error_responses(400, 401, 403, 404, 409),
)
def revoke_key(
    key_id: KeyIdPath, principal: PrincipalDep, tenants: TenantsDep, audit: TenantAuditDep
) -> Response:
    """Revoke a key of the tenant: refused everywhere within a second. The tenant's last
    admin key cannot be revoked (409): create another admin key first."""
    revoked = tenants.revoke_key(principal.tenant, key_id, keep_admin=True)
    audit(AuditAction.KEY_REVOKE, key_id, before=_described(revoked))
    return Response(status_code=status.HTTP_204_NO_CONTENT)
