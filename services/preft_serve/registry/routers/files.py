"""OpenAI's Files API for fine-tuning data: upload (validated line by line), list, get,
content, delete. Tenant-scoped: another tenant's file is a 404."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Query, Response, UploadFile
from fastapi.responses import StreamingResponse

from preft_serve.common.audit_wire import AuditAction
from preft_serve.common.errors import error_responses
from preft_serve.common.finetune_wire import FileDeleted, FileList, FileObject
from preft_serve.registry.audit_deps import TenantAuditDep
from preft_serve.registry.deps import PrincipalDep
from preft_serve.registry.finetune.deps import FilesDep

router = APIRouter(prefix="/v1/files", tags=["files"])


@router.post("", response_model=FileObject, responses=error_responses(400, 401, 403, 413))
def upload_file(
    principal: PrincipalDep,
    files: FilesDep,
    file: Annotated[UploadFile, File(description='JSONL, one {"messages": [...]} per line')],
    purpose: Annotated[
        Literal["fine-tune"], Form(description="fine-tune (the only purpose this registry stores)")
    ],
    audit: TenantAuditDep,
) -> FileObject:
    """Upload training or validation data; every bad line is named (400) and nothing is
    stored unless the whole file is valid."""
    stored = files.upload(principal.tenant, file.filename or "", purpose, file.file)
    audit(AuditAction.FILE_UPLOAD, stored.id, after=files.sha256(principal.tenant, stored.id))
    return stored


@router.get("", response_model=FileList, responses=error_responses(401, 403))
def list_files(
    principal: PrincipalDep,
    files: FilesDep,
    purpose: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 10000,
    after: Annotated[str | None, Query(max_length=64)] = None,
) -> FileList:
    """Your files, newest first."""
    return files.list(principal.tenant, limit, after, purpose)


@router.get("/{file_id}", response_model=FileObject, responses=error_responses(401, 403, 404))
def get_file(file_id: str, principal: PrincipalDep, files: FilesDep) -> FileObject:
    return files.get(principal.tenant, file_id)


@router.get(
    "/{file_id}/content",
    response_class=Response,
    responses={
        200: {"content": {"application/octet-stream": {}}},
        **error_responses(401, 403, 404),
    },
)
def file_content(file_id: str, principal: PrincipalDep, files: FilesDep) -> Response:
    """The file's bytes as uploaded (result files: a job's per-step metrics CSV), sent in
    chunks so a client that stops reading is felt (and cut off: ``transfer_gate``)."""
    content = files.content(principal.tenant, file_id)
    return StreamingResponse(
        _chunks(content),
        media_type="application/octet-stream",
        headers={"Content-Length": str(len(content))},
    )


def _chunks(content: bytes, size: int = 64 << 10) -> Iterator[bytes]:
    view = memoryview(content)
    for start in range(0, len(content), size):
        yield bytes(view[start : start + size])


@router.delete("/{file_id}", response_model=FileDeleted, responses=error_responses(401, 403, 404))
def delete_file(
    file_id: str, principal: PrincipalDep, files: FilesDep, audit: TenantAuditDep
) -> FileDeleted:
    before = files.sha256(principal.tenant, file_id)
    files.delete(principal.tenant, file_id)
    audit(AuditAction.FILE_DELETE, file_id, before=before)
    return FileDeleted(id=file_id)
