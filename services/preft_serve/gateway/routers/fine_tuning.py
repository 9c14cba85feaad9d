"""OpenAI's fine-tuning jobs API, forwarded to the registry (``gateway.registry_proxy``):
create, list, get, cancel, events, checkpoints."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from preft_serve.common.errors import error_responses
from preft_serve.common.finetune_wire import (
    CheckpointList,
    EventList,
    FineTuningJob,
    JobCreate,
    JobList,
)
from preft_serve.gateway.deps import StateDep, TenantDep
from preft_serve.gateway.openapi import json_body, query
from preft_serve.gateway.registry_proxy import forward
from preft_serve.gateway.routers.files import FORWARD_ERRORS

router = APIRouter(prefix="/v1/fine_tuning/jobs", tags=["fine-tuning"])
BODY_MODELS = (JobCreate,)  # documented, not parsed here (app: document_models)
PAGE = query("after", "limit")


@router.post(
    "",
    response_model=FineTuningJob,
    openapi_extra=json_body(JobCreate),
    responses=error_responses(400, 404, 408, 422, *FORWARD_ERRORS),
)
async def create_job(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Queue a job that trains a PreFT adapter on a file; on success the adapter is
    registered under ``suffix`` (the job's ``fine_tuned_model``) and can be named as
    ``model`` here at once."""
    return await forward(state.registry_http, request, owner)


@router.get(
    "", response_model=JobList, openapi_extra=PAGE, responses=error_responses(*FORWARD_ERRORS)
)
async def list_jobs(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Your jobs, newest first."""
    return await forward(state.registry_http, request, owner)


@router.get(
    "/{job_id}", response_model=FineTuningJob, responses=error_responses(404, *FORWARD_ERRORS)
)
async def get_job(job_id: str, request: Request, state: StateDep, owner: TenantDep) -> Response:
    return await forward(state.registry_http, request, owner)


@router.post(
    "/{job_id}/cancel",
    response_model=FineTuningJob,
    responses=error_responses(404, 409, *FORWARD_ERRORS),
)
async def cancel_job(job_id: str, request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Stop a queued or running job; nothing is registered."""
    return await forward(state.registry_http, request, owner)


@router.get(
    "/{job_id}/events",
    response_model=EventList,
    openapi_extra=PAGE,
    responses=error_responses(400, 404, *FORWARD_ERRORS),
)
async def list_events(job_id: str, request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Progress (``type`` metrics: step, train_loss, learning_rate) and status messages,
    newest first."""
    return await forward(state.registry_http, request, owner)


@router.get(
    "/{job_id}/checkpoints",
    response_model=CheckpointList,
    openapi_extra=PAGE,
    responses=error_responses(404, *FORWARD_ERRORS),
)
async def list_checkpoints(
    job_id: str, request: Request, state: StateDep, owner: TenantDep
) -> Response:
    """The registered adapter version of a succeeded job."""
    return await forward(state.registry_http, request, owner)
