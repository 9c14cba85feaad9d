"""OpenAI's fine-tuning jobs API, training PreFT adapters: create, list, get, cancel,
events, checkpoints. Tenant-scoped: another tenant's job is a 404."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.datastructures import QueryParams

from preft_serve.common.audit_wire import AuditAction
from preft_serve.common.errors import BadRequest, error_responses
from preft_serve.common.finetune_wire import (
    CheckpointList,
    EventList,
    FineTuningJob,
    JobCreate,
    JobList,
)
from preft_serve.registry.audit_deps import TenantAuditDep
from preft_serve.registry.deps import PrincipalDep
from preft_serve.registry.finetune.deps import JobsDep
from preft_serve.registry.finetune.service import MetadataFilter, check_metadata

router = APIRouter(prefix="/v1/fine_tuning/jobs", tags=["fine-tuning"])
Limit = Annotated[int, Query(ge=1, le=100)]
After = Annotated[
    str | None, Query(max_length=64, description="Id of the last item of the previous page")
]


@router.post(
    "", response_model=FineTuningJob, responses=error_responses(400, 401, 403, 404, 422, 429)
)
def create_job(
    body: JobCreate, principal: PrincipalDep, jobs: JobsDep, audit: TenantAuditDep
) -> FineTuningJob:
    """Queue a job that trains a PreFT adapter (``method.type`` ``preft``: LoRA, DiReFT or
    LoReFT) on a file; on success the adapter is registered under ``suffix`` (the job's
    ``fine_tuned_model``), ready for ``PUT /v1/users/{user}``."""
    job = jobs.create(principal.tenant, body, actor=principal.key_id)
    audit(AuditAction.JOB_CREATE, job.id, after=job.status.value)
    return job


@router.get("", response_model=JobList, responses=error_responses(400, 401, 403, 404))
def list_jobs(
    request: Request, principal: PrincipalDep, jobs: JobsDep, after: After = None, limit: Limit = 20
) -> JobList:
    """Your jobs, newest first. ``metadata[k]=v`` (repeatable) keeps the jobs whose metadata
    holds every such pair; ``metadata=null`` keeps those created without metadata."""
    return jobs.list(principal.tenant, after, limit, metadata_filter(request.query_params))


def metadata_filter(query: QueryParams) -> MetadataFilter:
    """OpenAI's deep-object form (``metadata[k]=v``), as the SDK sends ``metadata=``."""
    pairs = {
        key[len("metadata[") : -1]: value
        for key, value in query.multi_items()
        if key.startswith("metadata[") and key.endswith("]")
    }
    plain = query.get("metadata")
    if plain is not None and (pairs or plain != "null"):
        raise BadRequest(
            "filter with metadata[key]=value pairs, or metadata=null alone", param="metadata"
        )
    check_metadata(pairs)
    return "null" if plain is not None else pairs or None


@router.get("/{job_id}", response_model=FineTuningJob, responses=error_responses(401, 403, 404))
def get_job(job_id: str, principal: PrincipalDep, jobs: JobsDep) -> FineTuningJob:
    return jobs.get(principal.tenant, job_id)


@router.post(
    "/{job_id}/cancel", response_model=FineTuningJob, responses=error_responses(401, 403, 404, 409)
)
def cancel_job(
    job_id: str, principal: PrincipalDep, jobs: JobsDep, audit: TenantAuditDep
) -> FineTuningJob:
    """Stop a queued or running job; nothing is registered."""
    before = jobs.get(principal.tenant, job_id).status
    job = jobs.cancel(principal.tenant, job_id)
    if job.status is not before:  # cancelling a cancelled job changes nothing
        audit(AuditAction.JOB_CANCEL, job_id, before=before.value, after=job.status.value)
    return job


@router.get(
    "/{job_id}/events", response_model=EventList, responses=error_responses(400, 401, 403, 404)
)
def list_events(
    job_id: str, principal: PrincipalDep, jobs: JobsDep, after: After = None, limit: Limit = 20
) -> EventList:
    """Progress (``type`` ``metrics``: step, train_loss, learning_rate) and status
    messages, newest first."""
    return jobs.events(principal.tenant, job_id, after, limit)


@router.get(
    "/{job_id}/checkpoints", response_model=CheckpointList, responses=error_responses(401, 403, 404)
)
def list_checkpoints(
    job_id: str, principal: PrincipalDep, jobs: JobsDep, after: After = None, limit: Limit = 10
) -> CheckpointList:
    """The registered adapter version of a succeeded job."""
    return jobs.checkpoints(principal.tenant, job_id, after, limit)
