"""OpenAI's Files API, forwarded to the registry (``gateway.registry_proxy``), so the
base URL that serves completions also takes fine-tuning data."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from preft_serve.common.errors import error_responses
from preft_serve.common.finetune_wire import FileDeleted, FileList, FileObject
from preft_serve.gateway.deps import StateDep, TenantDep
from preft_serve.gateway.openapi import UPLOAD_BODY, query
from preft_serve.gateway.registry_proxy import forward

router = APIRouter(prefix="/v1/files", tags=["files"])
# No or bad key; over the tenant's share of registry calls; no registry; registry down or
# busy. A body that stops arriving is a 408. (403: a key whose role does not allow the
# route, or a quota for an upload.)
FORWARD_ERRORS = (401, 403, 429, 501, 503)


@router.post(
    "",
    response_model=FileObject,
    openapi_extra=UPLOAD_BODY,
    responses=error_responses(400, 408, 413, *FORWARD_ERRORS),
)
async def upload_file(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Upload training or validation data (``purpose`` fine-tune); every bad line is named
    (400) and nothing is stored unless the whole file is valid."""
    return await forward(state.registry_http, request, owner)


@router.get(
    "",
    response_model=FileList,
    responses=error_responses(*FORWARD_ERRORS),
    openapi_extra=query("purpose", "limit", "after"),
)
async def list_files(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Your files, newest first."""
    return await forward(state.registry_http, request, owner)


@router.get(
    "/{file_id}", response_model=FileObject, responses=error_responses(404, *FORWARD_ERRORS)
)
async def get_file(file_id: str, request: Request, state: StateDep, owner: TenantDep) -> Response:
    return await forward(state.registry_http, request, owner)


@router.get(
    "/{file_id}/content",
    response_class=Response,
    responses={
        200: {"content": {"application/octet-stream": {}}},
        **error_responses(404, *FORWARD_ERRORS),
    },
)
async def file_content(
    file_id: str, request: Request, state: StateDep, owner: TenantDep
) -> Response:
    """The file's bytes as uploaded (result files: a job's per-step metrics CSV)."""
    return await forward(state.registry_http, request, owner)


@router.delete(
    "/{file_id}", response_model=FileDeleted, responses=error_responses(404, *FORWARD_ERRORS)
)
async def delete_file(
    file_id: str, request: Request, state: StateDep, owner: TenantDep
) -> Response:
    return await forward(state.registry_http, request, owner)
