"""The audit log's FastAPI side: who is calling (key id or operator) and the request id,
bound into a :class:`Auditor` the routers call after a change commits."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from fastapi import Depends, Request

from preft_serve.common.access_log import request_id_of
from preft_serve.common.audit_wire import AuditAction
from preft_serve.registry.audit import OPERATOR, AuditLog
from preft_serve.registry.deps import AdminDep, PrincipalDep, StateDep


@dataclasses.dataclass(frozen=True)
class Auditor:
    """One request's recorder: tenant (None for the operator: each call names it), actor
    and request id are fixed, so a route's call names only what changed."""

    log: AuditLog
    actor: str
    request_id: str | None
    tenant: str | None = None

    def __call__(
        self,
        action: AuditAction,
        target: str,
        *,
        before: str | None = None,
        after: str | None = None,
        tenant: str | None = None,
        reset: bool = False,
    ) -> None:
        owner = tenant or self.tenant
        assert owner is not None, "an operator's entry names its tenant"
        self.log.record(
            owner,
            self.actor,
            action,
            target,
            before=before,
            after=after,
            request_id=self.request_id,
            reset=reset,
        )


def audit_log(request: Request, state: StateDep) -> AuditLog:
    return AuditLog.for_settings(
        state.redis, state.settings, request.app.state.metrics.audit_write_failures
    )


AuditLogDep = Annotated[AuditLog, Depends(audit_log)]


def _tenant_auditor(request: Request, principal: PrincipalDep, log: AuditLogDep) -> Auditor:
    return Auditor(log, principal.key_id, request_id_of(request), principal.tenant)


def _operator_auditor(request: Request, _: AdminDep, log: AuditLogDep) -> Auditor:
    return Auditor(log, OPERATOR, request_id_of(request))


TenantAuditDep = Annotated[Auditor, Depends(_tenant_auditor)]
OperatorAuditDep = Annotated[Auditor, Depends(_operator_auditor)]
