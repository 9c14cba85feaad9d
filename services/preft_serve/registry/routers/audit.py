"""The audit log: a tenant key reads its own tenant's entries, the admin token every
tenant's (optionally one, with ``tenant``)."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from preft_serve.common.access_log import access_fields
from preft_serve.common.audit_wire import AuditAction, AuditPage
from preft_serve.common.domain_errors import InvalidRequest
from preft_serve.common.errors import error_responses
from preft_serve.registry.audit import (
    ACTOR_PATTERN,
    CURSOR_PATTERN,
    DEFAULT_LIMIT,
    MAX_LIMIT,
    TIME_PATTERN,
    build_query,
)
from preft_serve.registry.audit_deps import AuditLogDep
from preft_serve.registry.deps import (
    Credentials,
    StateDep,
    _admin_bearer,
    _tenant_bearer,
    require_tenant,
)
from preft_serve.registry.names import TENANT_PATTERN

router = APIRouter(prefix="/v1/audit", tags=["audit"])
_TIME = "RFC 3339 (2026-01-31T12:00:00Z) or unix seconds"


def _reader(
    request: Request,
    state: StateDep,
    admin: Annotated[Credentials, Depends(_admin_bearer)],
    key: Annotated[Credentials, Depends(_tenant_bearer)],
) -> str | None:
    """The tenant whose log the caller may read; None: the operator, every tenant."""
    expected = state.settings.admin_token.get_secret_value().encode()
    if (
        admin is not None
        and admin.scheme.lower() == "bearer"
        and hmac.compare_digest(admin.credentials.encode(), expected)
    ):
        access_fields(request)["admin"] = True
        return None
    return require_tenant(request, state, key).tenant


@router.get("", response_model=AuditPage, responses=error_responses(400, 401, 403, 422))
def read_audit_log(
    log: AuditLogDep,
    own: Annotated[str | None, Depends(_reader)],
    tenant: Annotated[
        str | None,
        Query(
            description="Operator only: one tenant's entries (a tenant key reads its own)",
            json_schema_extra={"pattern": TENANT_PATTERN},
        ),
    ] = None,
    since: Annotated[
        str | None,
        Query(
            description=f"Entries at or after: {_TIME}", json_schema_extra={"pattern": TIME_PATTERN}
        ),
    ] = None,
    until: Annotated[
        str | None,
        Query(
            description=f"Entries at or before: {_TIME}",
            json_schema_extra={"pattern": TIME_PATTERN},
        ),
    ] = None,
    actor: Annotated[
        str | None,
        Query(
            description="An API key id, or `operator`", json_schema_extra={"pattern": ACTOR_PATTERN}
        ),
    ] = None,
    action: Annotated[
        str | None,
        Query(description="One action", json_schema_extra={"enum": [a.value for a in AuditAction]}),
    ] = None,
    limit: Annotated[
        int,
        Query(
            description=f"Entries per page, 1 to {MAX_LIMIT}",
            json_schema_extra={"minimum": 1, "maximum": MAX_LIMIT},
        ),
    ] = DEFAULT_LIMIT,
    after: Annotated[
        str | None,
        Query(
            description="next_cursor of the previous page",
            json_schema_extra={"pattern": CURSOR_PATTERN},
        ),
    ] = None,
) -> AuditPage:
    """Who changed what, oldest first: tenant and adapter changes, bindings, fine-tuning
    jobs and files, each with the acting key id (or `operator`), the target, what it was
    before and after, and the request id. A page may hold fewer than ``limit`` entries
    when filters skip many; go on while ``next_cursor`` is set."""
    if own is not None:
        if tenant is not None and tenant != own:
            raise InvalidRequest(
                "a tenant key reads only its own tenant's audit log; leave out 'tenant'",
                param="tenant",
            )
        tenant = own
    return log.query(
        build_query(
            tenant=tenant,
            since=since,
            until=until,
            actor=actor,
            action=action,
            limit=limit,
            after=after,
        )
    )
