"""Tenant endpoints for adapters: upload, versions (hot swap), list, show, delete."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, File, Form, Query, Response, UploadFile, status
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from preft_serve.adapters.format import AdapterMode
from preft_serve.common.audit_wire import AuditAction
from preft_serve.common.domain_errors import NotFound
from preft_serve.common.errors import error_responses
from preft_serve.registry.adapters import AdapterService, UploadResult
from preft_serve.registry.audit_deps import Auditor, TenantAuditDep
from preft_serve.registry.deps import AdaptersDep, PrincipalDep
from preft_serve.registry.ingest import UploadedFile
from preft_serve.registry.names import ADAPTER_PATTERN
from preft_serve.registry.routers.path_params import AdapterPath
from preft_serve.registry.schemas import (
    AdapterDetail,
    AdapterPage,
    AdapterUploaded,
    AdapterVersion,
    RollbackIn,
)

router = APIRouter(prefix="/v1/adapters", tags=["adapters"])

FilesField = Annotated[
    list[UploadFile],
    File(
        description="adapter_config.json and adapter_model.safetensors as two parts, or one "
        ".tar.gz/.zip of the adapter folder",
        json_schema_extra={"minItems": 1},
    ),
]
_UPLOAD_ERRORS = error_responses(400, 401, 403, 409, 413, 415, 422)
StrictQuery = Annotated[
    bool,
    Query(
        description="Refuse the upload (422) instead of accepting it with warnings, e.g. when "
        "its base_model_name_or_path names another model"
    ),
]


def _files(files: list[UploadFile]) -> list[UploadedFile]:
    return [UploadedFile(f.filename or "", f.file) for f in files]


def _version_id(rec: AdapterVersion) -> str:
    return f"v{rec.version}:{rec.sha256}"


def _audit_version(
    audit: Auditor, action: AuditAction, adapters: AdapterService, tenant: str, result: UploadResult
) -> None:
    """Record a committed new version, with the one it replaced (history is append-only,
    so version n - 1 is exactly what was current)."""
    if not result.created:
        return
    rec, before = result.version, None
    if rec.version > 1:
        try:
            before = _version_id(adapters.version(tenant, rec.name, rec.version - 1))
        except NotFound:  # deleted in the meantime: the entry still names the new one
            before = None
    audit(action, rec.name, before=before, after=_version_id(rec))


def _uploaded(result: UploadResult, response: Response) -> AdapterUploaded:
    response.status_code = status.HTTP_201_CREATED if result.created else status.HTTP_200_OK
    return AdapterUploaded(**result.version.model_dump(), warnings=list(result.warnings))


@router.post(
    "",
    response_model=AdapterUploaded,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {
            "description": "Identical content already uploaded: unchanged",
            "model": AdapterUploaded,
        },
        **_UPLOAD_ERRORS,
    },
)
def upload_adapter(
    principal: PrincipalDep,
    adapters: AdaptersDep,
    response: Response,
    name: Annotated[
        str,
        Form(
            description="Adapter name, unique within your tenant",
            json_schema_extra={"pattern": ADAPTER_PATTERN},
        ),
    ],
    mode: Annotated[AdapterMode, Form(description="prefill (PreFT) or all (classic)")],
    files: FilesField,
    audit: TenantAuditDep,
    strict: StrictQuery = False,
) -> AdapterUploaded:
    """Upload a new adapter (version 1). Re-uploading identical content is a no-op (200)."""
    result = adapters.upload(
        principal.tenant, name, mode, _files(files), create=True, strict=strict
    )
    _audit_version(audit, AuditAction.ADAPTER_UPLOAD, adapters, principal.tenant, result)
    return _uploaded(result, response)


@router.put(
    "/{name}",
    response_model=AdapterUploaded,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {
            "description": "Identical to the current version: unchanged",
            "model": AdapterUploaded,
        },
        **_UPLOAD_ERRORS,
    },
)
def upload_version(
    name: AdapterPath,
    principal: PrincipalDep,
    adapters: AdaptersDep,
    response: Response,
    files: FilesField,
    audit: TenantAuditDep,
    mode: Annotated[AdapterMode | None, Form(description="Defaults to the current mode")] = None,
    strict: StrictQuery = False,
) -> AdapterUploaded:
    """Upload the next version (the hot swap: bound users move to it at once)."""
    result = adapters.upload(
        principal.tenant, name, mode, _files(files), create=False, strict=strict
    )
    _audit_version(audit, AuditAction.ADAPTER_VERSION, adapters, principal.tenant, result)
    return _uploaded(result, response)


@router.get("", response_model=AdapterPage, responses=error_responses(400, 401))
def list_adapters(
    principal: PrincipalDep,
    adapters: AdaptersDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[
        str | None,
        Query(
            description="next_cursor of the previous page",
            json_schema_extra={"pattern": ADAPTER_PATTERN},
        ),
    ] = None,
) -> AdapterPage:
    items, next_cursor = adapters.list(principal.tenant, limit, cursor)
    return AdapterPage(items=items, next_cursor=next_cursor)


@router.get("/{name}", response_model=AdapterDetail, responses=error_responses(400, 401, 404))
def get_adapter(name: AdapterPath, principal: PrincipalDep, adapters: AdaptersDep) -> AdapterDetail:
    """Current version plus the full version history."""
    return adapters.get(principal.tenant, name)


@router.delete(
    "/{name}", status_code=status.HTTP_204_NO_CONTENT, responses=error_responses(400, 401, 404, 409)
)
def delete_adapter(
    name: AdapterPath,
    principal: PrincipalDep,
    adapters: AdaptersDep,
    audit: TenantAuditDep,
    force: Annotated[bool, Query(description="Also unbind users bound to it")] = False,
) -> Response:
    current = adapters.version(principal.tenant, name, None)
    unbound = adapters.delete(principal.tenant, name, force=force)
    audit(
        AuditAction.ADAPTER_DELETE,
        name,
        before=_version_id(current),
        after=f"{unbound} user(s) unbound" if unbound else None,
    )
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/{name}/rollback",
    response_model=AdapterVersion,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {
            "description": "That version's content is already current: unchanged",
            "model": AdapterVersion,
        },
        **error_responses(400, 401, 404, 422),
    },
)
def rollback_adapter(
    name: AdapterPath,
    body: RollbackIn,
    principal: PrincipalDep,
    adapters: AdaptersDep,
    response: Response,
    audit: TenantAuditDep,
) -> AdapterVersion:
    """Make an earlier version's content current again, as the next version (history stays
    append-only; bound users move to it at once, like an upload)."""
    result = adapters.rollback(principal.tenant, name, body.version)
    _audit_version(audit, AuditAction.ADAPTER_ROLLBACK, adapters, principal.tenant, result)
    response.status_code = status.HTTP_201_CREATED if result.created else status.HTTP_200_OK
    return result.version


@router.get(
    "/{name}/download",
    response_class=FileResponse,
    responses={
        200: {
            "description": "A .tar.gz with adapter_config.json and "
            "adapter_model.safetensors at its root, as stored",
            "content": {"application/gzip": {}},
        },
        **error_responses(400, 401, 404, 422),
    },
)
def download_adapter(
    name: AdapterPath,
    principal: PrincipalDep,
    adapters: AdaptersDep,
    version: Annotated[int | None, Query(ge=1, description="Default: the current version")] = None,
) -> FileResponse:
    """The stored files of one version; uploading them again gives the same sha256."""
    tmp = tempfile.mkdtemp(dir=adapters.staging_dir, prefix="preft-download-")
    try:
        rec, archive = adapters.export(principal.tenant, name, version, Path(tmp))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return FileResponse(
        archive,
        media_type="application/gzip",
        filename=archive.name,
        headers={"X-Preft-Version": str(rec.version), "X-Preft-Sha256": rec.sha256},
        background=BackgroundTask(shutil.rmtree, tmp, ignore_errors=True),
    )
