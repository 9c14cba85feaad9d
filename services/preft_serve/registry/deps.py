"""FastAPI dependencies: the shared state, and the two kinds of caller (admin, tenant)."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from preft_serve.common import key_roles
from preft_serve.common.access_log import access_fields
from preft_serve.common.errors import Unauthorized
from preft_serve.registry.adapters import AdapterService
from preft_serve.registry.bindings import BindingService
from preft_serve.registry.state import RegistryState
from preft_serve.registry.tenants import Principal, TenantService
from preft_serve.registry.usage import UsageService

_admin_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="AdminToken",
    description="The registry's admin token (PREFT_REGISTRY_ADMIN_TOKEN)",
)
_tenant_bearer = HTTPBearer(
    auto_error=False, scheme_name="TenantApiKey", description="A tenant API key (pft_...)"
)
Credentials = HTTPAuthorizationCredentials | None


def get_state(request: Request) -> RegistryState:
    state: RegistryState = request.app.state.registry
    return state


StateDep = Annotated[RegistryState, Depends(get_state)]


def _bearer(credentials: Credentials, who: str) -> str:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized(f"missing credentials: send 'Authorization: Bearer <{who}>'")
    return credentials.credentials


def require_admin(
    request: Request,
    state: StateDep,
    credentials: Annotated[Credentials, Depends(_admin_bearer)],
) -> None:
    token = _bearer(credentials, "admin token")
    expected = state.settings.admin_token.get_secret_value()
    if not hmac.compare_digest(token.encode(), expected.encode()):
        raise Unauthorized("invalid admin token")
    access_fields(request)["admin"] = True


def require_tenant(
    request: Request,
    state: StateDep,
    credentials: Annotated[Credentials, Depends(_tenant_bearer)],
) -> Principal:
    """The key's tenant, once its role allows this route (``common.key_roles``: 403
    ``insufficient_role`` otherwise)."""
    principal = state.tenants.authenticate(_bearer(credentials, "API key"))
    access_fields(request)["tenant"] = principal.tenant
    route = request.scope.get("route")
    path = key_roles.route_path(getattr(route, "path", None), request.url.path)
    key_roles.check(principal.role, request.method, path)
    return principal


def _principal(
    request: Request,
    state: StateDep,
    credentials: Annotated[Credentials, Depends(_tenant_bearer)],
) -> Iterator[Principal]:
    """:func:`require_tenant`, then the key's last use recorded once the route has
    succeeded (a refused request changes nothing; the write never fails a request)."""
    principal = require_tenant(request, state, credentials)
    yield principal
    state.tenants.record_use(principal)


def tenant_of_header(
    state: RegistryState, authorization: str | None, method: str, path: str
) -> Principal:
    """``require_tenant``'s check, key and role, from a raw ``Authorization`` header and
    the request's method and URL path (for middleware, which runs before routing and
    FastAPI's dependencies, so there is no route template to classify by)."""
    scheme, token = get_authorization_scheme_param(authorization)
    credentials = (
        HTTPAuthorizationCredentials(scheme=scheme, credentials=token) if scheme and token else None
    )
    principal = state.tenants.authenticate(_bearer(credentials, "API key"))
    key_roles.check(principal.role, method, key_roles.route_path(None, path))
    return principal


def _tenants(state: StateDep) -> TenantService:
    return state.tenants


def _adapters(state: StateDep) -> AdapterService:
    return state.adapters


def _bindings(state: StateDep) -> BindingService:
    return state.bindings


AdminDep = Annotated[None, Depends(require_admin)]
PrincipalDep = Annotated[Principal, Depends(_principal)]
TenantsDep = Annotated[TenantService, Depends(_tenants)]
AdaptersDep = Annotated[AdapterService, Depends(_adapters)]
BindingsDep = Annotated[BindingService, Depends(_bindings)]


def _usage(state: StateDep) -> UsageService:
    return state.usage


UsageDep = Annotated[UsageService, Depends(_usage)]
