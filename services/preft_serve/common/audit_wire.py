"""The audit log's page as it goes over the wire: served by the registry
(``preft_serve.registry.audit``) and documented by the gateway that forwards it (which
imports nothing of the registry)."""

from __future__ import annotations

import enum

from pydantic import BaseModel, Field


class AuditAction(enum.StrEnum):
    """The fixed vocabulary of recorded changes."""

    TENANT_CREATE = "tenant.create"
    TENANT_DELETE = "tenant.delete"
    TENANT_UPDATE = "tenant.update"  # storage quotas, unbound_user
    TENANT_RATE_LIMITS = "tenant.rate_limits"
    KEY_CREATE = "key.create"
    KEY_REVOKE = "key.revoke"
    ADAPTER_UPLOAD = "adapter.upload"
    ADAPTER_VERSION = "adapter.version"
    ADAPTER_ROLLBACK = "adapter.rollback"
    ADAPTER_POLICY = "adapter.policy"  # serving policy: promote, roll back, canary split
    ADAPTER_DELETE = "adapter.delete"
    BINDING_SET = "binding.set"
    BINDING_DELETE = "binding.delete"
    JOB_CREATE = "fine_tuning.job.create"
    JOB_CANCEL = "fine_tuning.job.cancel"
    FILE_UPLOAD = "file.upload"
    FILE_DELETE = "file.delete"


class AuditEntry(BaseModel):
    id: str = Field(description="Stream id; pass it as `after` to read on from here")
    time: str = Field(description="When it was recorded (RFC 3339, UTC)")
    tenant: str
    actor: str = Field(description="The API key id that made the change, or `operator`")
    action: AuditAction
    target: str = Field(description="What changed: adapter name, user id, job id, file id ...")
    before: str | None = Field(
        None,
        description="What the target was before (a version "
        "`v<n>:<sha256>`, an adapter name, settings as JSON ...)",
    )
    after: str | None = Field(None, description="What it is now, in the same form")
    request_id: str | None = Field(None, description="The request's x-request-id")


class AuditPage(BaseModel):
    object: str = "list"
    data: list[AuditEntry]
    next_cursor: str | None = Field(description="`after` for the next page; null: no more")
