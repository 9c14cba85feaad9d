"""OpenAI's Files API, forwarded to the registry (``gateway.registry_proxy``), so the
base URL that serves completions also takes fine-tuning data."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from preft_serve.common.errors import error_responses
from preft_serve.gateway.deps import StateDep
from preft_serve.gateway.openapi import UPLOAD_BODY, query
from preft_serve.gateway.registry_proxy import forward
from preft_serve.registry.finetune.models import FileDeleted, FileList, FileObject

router = APIRouter(prefix="/v1/files", tags=["files"])
SECURITY: dict[str, Any] = {"security": [{"TenantApiKey": []}]}
FORWARD_ERRORS = (401, 501, 503)  # the registry's key check; no registry; registry down


@router.post("", response_model=FileObject, openapi_extra={**UPLOAD_BODY, **SECURITY},
             responses=error_responses(400, 403, 413, *FORWARD_ERRORS))
async def upload_file(request: Request, state: StateDep) -> Response:
    """Upload training or validation data (``purpose`` fine-tune); every bad line is named
    (400) and nothing is stored unless the whole file is valid."""
    return await forward(state.registry_http, request)


@router.get("", response_model=FileList, responses=error_responses(*FORWARD_ERRORS),
            openapi_extra={**query("purpose", "limit", "after"), **SECURITY})
async def list_files(request: Request, state: StateDep) -> Response:
    """Your files, newest first."""
    return await forward(state.registry_http, request)


@router.get("/{file_id}", response_model=FileObject, openapi_extra=SECURITY,
            responses=error_responses(404, *FORWARD_ERRORS))
async def get_file(file_id: str, request: Request, state: StateDep) -> Response:
    return await forward(state.registry_http, request)


@router.get("/{file_id}/content", response_class=Response, openapi_extra=SECURITY,
            responses={200: {"content": {"application/octet-stream": {}}},
                       **error_responses(404, *FORWARD_ERRORS)})
async def file_content(file_id: str, request: Request, state: StateDep) -> Response:
    """The file's bytes as uploaded (result files: a job's per-step metrics CSV)."""
    return await forward(state.registry_http, request)


@router.delete("/{file_id}", response_model=FileDeleted, openapi_extra=SECURITY,
               responses=error_responses(404, *FORWARD_ERRORS))
async def delete_file(file_id: str, request: Request, state: StateDep) -> Response:
    return await forward(state.registry_http, request)
