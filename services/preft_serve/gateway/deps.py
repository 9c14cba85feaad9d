"""FastAPI dependencies: the shared state and the authenticated tenant."""

from __future__ import annotations

from typing import Annotated, TypeVar

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from preft_serve.common import key_roles
from preft_serve.common.access_log import access_fields
from preft_serve.common.errors import Forbidden, ServiceError, Unauthorized
from preft_serve.common.registry_client import KeyOwner
from preft_serve.gateway.state import GatewayState

E = TypeVar("E", bound=ServiceError)
_tenant_bearer = HTTPBearer(
    auto_error=False, scheme_name="TenantApiKey", description="A tenant API key (pft_...)"
)


async def get_state(request: Request) -> GatewayState:
    """Async so FastAPI does not hop to its thread pool for every request."""
    state: GatewayState = request.app.state.gateway
    return state


StateDep = Annotated[GatewayState, Depends(get_state)]


def _counted(state: GatewayState, error: E) -> E:
    state.metrics.errors.labels(error.code).inc()
    return error


async def require_tenant(
    request: Request,
    state: StateDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_tenant_bearer)],
) -> KeyOwner:
    """The key's owner, once its role allows this route (``common.key_roles``: files,
    fine-tuning and deleting models need developer, the audit log admin; 403
    ``insufficient_role`` otherwise)."""
    owner = await _owner(state, request, credentials.credentials if credentials else None)
    route = request.scope.get("route")
    try:
        path = key_roles.route_path(getattr(route, "path", None), request.url.path)
        key_roles.check(owner.role, request.method, path)
    except key_roles.InsufficientRole as refused:
        raise _counted(state, Forbidden(refused.message, code=refused.code)) from None
    return owner


async def authenticate(state: GatewayState, request: Request) -> KeyOwner:
    """:func:`require_tenant` without FastAPI's dependency solving, for the completion
    routes (solving their dependencies was ~20% of the gateway's in-process CPU per
    request), which every role may use, so no role is checked. Parses the header with
    the same helper as ``HTTPBearer``."""
    scheme, token = get_authorization_scheme_param(request.headers.get("authorization"))
    valid = scheme.lower() == "bearer" and token
    return await _owner(state, request, token if valid else None)


async def _owner(state: GatewayState, request: Request, api_key: str | None) -> KeyOwner:
    if api_key is None:
        raise _counted(
            state,
            Unauthorized(
                "missing credentials: send 'Authorization: Bearer <tenant API key>'",
                code="missing_api_key",
            ),
        )
    owner = await state.registry.authenticate(api_key)
    if owner is None:
        raise _counted(
            state,
            Unauthorized(
                "invalid API key (unknown, revoked or expired): use a valid key issued by "
                "the registry for your tenant"
            ),
        )
    access_fields(request)["tenant"] = owner.tenant
    return owner


TenantDep = Annotated[KeyOwner, Depends(require_tenant)]
