"""Tenant endpoints for adapters: upload, versions (hot swap or staged), serving policy
(promote, roll back, canary split), the evaluation gate, list, show, delete."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, File, Form, Header, Query, Response, UploadFile, status
from fastapi import Path as PathParam
from fastapi.responses import FileResponse
from starlette.types import Receive, Scope, Send

from preft_serve.adapters.format import AdapterMode
from preft_serve.common.audit_wire import AuditAction
from preft_serve.common.errors import error_responses
from preft_serve.registry.adapters import UploadResult, version_id
from preft_serve.registry.audit_deps import Auditor, TenantAuditDep
from preft_serve.registry.deps import AdaptersDep, PrincipalDep
from preft_serve.registry.evaluation import EvaluationService
from preft_serve.registry.evaluation_schemas import (
    EvaluationCounts,
    EvaluationIn,
    EvaluationOut,
    EvaluationResult,
)
from preft_serve.registry.finetune.deps import FilesDep
from preft_serve.registry.ingest import UploadedFile
from preft_serve.registry.names import ADAPTER_PATTERN
from preft_serve.registry.policy_schemas import (
    MAX_VERSION,
    PolicyIn,
    PolicyOut,
    VersionUploaded,
)
from preft_serve.registry.routers.path_params import AdapterCursor, AdapterPath, PageLimit
from preft_serve.registry.schemas import (
    AdapterDetail,
    AdapterPage,
    AdapterVersion,
    RollbackIn,
)
from preft_serve.registry.serving_policy import PolicyChange, PolicyService, policy_etag

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
PromoteQuery = Annotated[
    bool,
    Query(
        description="true: serve the new version to every user at once (the hot swap, any "
        "canary ends). Default false: the version is stored staged and users keep the "
        "version they get until it is promoted (POST /v1/adapters/{name}/versions/{version}"
        "/promote, after its evaluation if the name has one) or a canary names it. A new "
        "adapter's first version is served either way"
    ),
]


def _policies(adapters: AdaptersDep) -> PolicyService:
    return PolicyService(adapters.redis, adapters.keys, adapters.store, adapters.maxlen)


PoliciesDep = Annotated[PolicyService, Depends(_policies)]


def _evaluations(adapters: AdaptersDep) -> EvaluationService:
    return EvaluationService(adapters.redis, adapters.keys)


EvaluationsDep = Annotated[EvaluationService, Depends(_evaluations)]
ForceQuery = Annotated[
    bool,
    Query(
        description="Promote a staged version even though the adapter's evaluation has no "
        "passing result for it (the audit log records that the gate was skipped)"
    ),
]


def _files(files: list[UploadFile]) -> list[UploadedFile]:
    return [UploadedFile(f.filename or "", f.file) for f in files]


def _audit_version(audit: Auditor, action: AuditAction, result: UploadResult) -> None:
    """Record a committed new version, with the served one it replaced (a staged version
    replaces nothing: its entry says ``staged``)."""
    change = result.audit_change()
    if change is not None:
        audit(action, result.version.name, before=change[0], after=change[1])


def _uploaded(result: UploadResult, response: Response) -> VersionUploaded:
    response.status_code = status.HTTP_201_CREATED if result.created else status.HTTP_200_OK
    return VersionUploaded(
        **result.version.model_dump(), warnings=list(result.warnings), state=result.state
    )


@router.post(
    "",
    response_model=VersionUploaded,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {
            "description": "Identical content already uploaded: unchanged",
            "model": VersionUploaded,
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
    promote: PromoteQuery = False,
) -> VersionUploaded:
    """Upload a new adapter (version 1). Re-uploading identical content is a no-op (200)."""
    result = adapters.upload(
        principal.tenant, name, mode, _files(files), create=True, strict=strict, promote=promote
    )
    _audit_version(audit, AuditAction.ADAPTER_UPLOAD, result)
    return _uploaded(result, response)


@router.put(
    "/{name}",
    response_model=VersionUploaded,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {
            "description": "Identical to the current version: unchanged",
            "model": VersionUploaded,
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
    promote: PromoteQuery = False,
) -> VersionUploaded:
    """Upload the next version: staged (it serves nobody until promoted, so an evaluation
    or a canary can come first), or with ?promote=true the hot swap (bound users move to
    it at once, any canary ends)."""
    result = adapters.upload(
        principal.tenant, name, mode, _files(files), create=False, strict=strict, promote=promote
    )
    _audit_version(audit, AuditAction.ADAPTER_VERSION, result)
    return _uploaded(result, response)


@router.get("", response_model=AdapterPage, responses=error_responses(400, 401, 403))
def list_adapters(
    principal: PrincipalDep,
    adapters: AdaptersDep,
    limit: PageLimit = 100,
    cursor: AdapterCursor = None,
) -> AdapterPage:
    items, next_cursor = adapters.list(principal.tenant, limit, cursor)
    return AdapterPage(items=items, next_cursor=next_cursor)


@router.get("/{name}", response_model=AdapterDetail, responses=error_responses(400, 401, 403, 404))
def get_adapter(name: AdapterPath, principal: PrincipalDep, adapters: AdaptersDep) -> AdapterDetail:
    """Current version plus the full version history."""
    return adapters.get(principal.tenant, name)


@router.delete(
    "/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=error_responses(400, 401, 403, 404, 409),
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
        before=version_id(current),
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
        **error_responses(400, 401, 403, 404, 422),
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
    append-only; bound users move to it at once, like a promoted upload, and any canary
    ends).
    PUT /v1/adapters/{name}/policy serves an earlier version without a new one."""
    result = adapters.rollback(principal.tenant, name, body.version)
    _audit_version(audit, AuditAction.ADAPTER_ROLLBACK, result)
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
        **error_responses(400, 401, 403, 404, 422),
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
    return _TemporaryFileResponse(
        Path(tmp),
        archive,
        media_type="application/gzip",
        filename=archive.name,
        headers={"X-Preft-Version": str(rec.version), "X-Preft-Sha256": rec.sha256},
    )


class _TemporaryFileResponse(FileResponse):
    """A file answer whose folder is removed however the answer ends. Starlette's own
    ``background`` is skipped when it answers a Range header with 400 or 416, which left
    the weights and their archive (twice an adapter's size) in staging per request."""

    def __init__(self, folder: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.folder = folder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await anyio.to_thread.run_sync(shutil.rmtree, self.folder, True)


_POLICY_ERRORS = error_responses(400, 401, 403, 404, 422)
_POLICY_CHANGE_ERRORS = error_responses(400, 401, 403, 404, 409, 412, 422)
# Tags are 34 characters; a few of them, or "*", is all a client ever sends.
IfMatch = Annotated[
    str | None,
    Header(
        max_length=1024,
        description="Change the policy only if it is still the one this ETag (from a "
        "policy answer's ETag header) names; 412 and nothing changed otherwise",
    ),
]


def _tagged(response: Response, policy: PolicyOut) -> PolicyOut:
    """The policy's tag for ``If-Match``. It tags the served version and canary only, not
    the version list beside them, so no cache may keep the answer and revalidate it by
    the tag (``no-store``): an evaluation result would be hidden behind a 304."""
    response.headers["ETag"] = policy_etag(policy)
    response.headers["Cache-Control"] = "no-store"
    return policy


@router.get("/{name}/policy", response_model=PolicyOut, responses=_POLICY_ERRORS)
def get_policy(
    name: AdapterPath,
    principal: PrincipalDep,
    policies: PoliciesDep,
    response: Response,
    user: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=256,
            description="Also say which version this user id gets under the policy",
        ),
    ] = None,
) -> PolicyOut:
    """The serving policy: the version users get, the canary split if any, and every
    version with its state (staged, serving, retired). Its ETag header tags the policy
    for a conditional change (``If-Match``)."""
    return _tagged(response, policies.get(principal.tenant, name, user))


@router.put("/{name}/policy", response_model=PolicyOut, responses=_POLICY_CHANGE_ERRORS)
def set_policy(
    name: AdapterPath,
    body: PolicyIn,
    principal: PrincipalDep,
    policies: PoliciesDep,
    audit: TenantAuditDep,
    response: Response,
    force: ForceQuery = False,
    if_match: IfMatch = None,
) -> PolicyOut:
    """Serve one version (promote a staged one, or roll back to an older one: no new
    version is written), optionally with a canary version for a deterministic share of
    users. Gateways apply it at once. Refused with nothing changed when a version does
    not exist or its content is gone, (409) when the adapter has an evaluation and a
    staged version has no passing result for it, unless ``force``, and (412) when
    ``If-Match`` names a policy that has changed since."""
    change = policies.set(principal.tenant, name, body, force, if_match)
    _audit_policy(audit, name, change)
    return _tagged(response, change.policy)


@router.post(
    "/{name}/versions/{version}/promote",
    response_model=PolicyOut,
    responses=_POLICY_CHANGE_ERRORS,
)
def promote_version(
    name: AdapterPath,
    version: Annotated[int, PathParam(ge=1, le=MAX_VERSION)],
    principal: PrincipalDep,
    policies: PoliciesDep,
    audit: TenantAuditDep,
    response: Response,
    force: ForceQuery = False,
    if_match: IfMatch = None,
) -> PolicyOut:
    """Serve ``version`` to every user (ends any canary): the policy
    ``{"version": version, "canary": null}``. A staged version of an adapter with an
    evaluation needs a passing result (409 otherwise, nothing changed) unless ``force``;
    412 when ``If-Match`` names a policy that has changed since."""
    change = policies.set(
        principal.tenant, name, PolicyIn(version=version, canary=None), force, if_match
    )
    _audit_policy(audit, name, change)
    return _tagged(response, change.policy)


def _audit_policy(audit: Auditor, name: str, change: PolicyChange) -> None:
    if change.changed:
        after = change.after + (" (evaluation gate skipped: force)" if change.forced else "")
        audit(AuditAction.ADAPTER_POLICY, name, before=change.before, after=after)


_EVALUATION_ERRORS = error_responses(400, 401, 403, 404, 422)


@router.get("/{name}/evaluation", response_model=EvaluationOut, responses=_EVALUATION_ERRORS)
def get_evaluation(
    name: AdapterPath, principal: PrincipalDep, evaluations: EvaluationsDep
) -> EvaluationOut:
    """The adapter's evaluation: the file, metric, margin and max_tokens staged versions
    are evaluated with before they may be promoted. Results: GET /v1/adapters/{name}/policy."""
    return evaluations.get(principal.tenant, name)


@router.put("/{name}/evaluation", response_model=EvaluationOut, responses=_EVALUATION_ERRORS)
def set_evaluation(
    name: AdapterPath,
    body: EvaluationIn,
    principal: PrincipalDep,
    evaluations: EvaluationsDep,
    files: FilesDep,
    audit: TenantAuditDep,
) -> EvaluationOut:
    """Attach an evaluation file (chat JSONL; each line's last message is the expected
    answer). From then on a staged version is promoted only with a passing result (or
    ``force``). The file is checked whole; nothing is stored when it does not fit."""
    config = evaluations.set(principal.tenant, name, body, files)
    audit(AuditAction.ADAPTER_POLICY, name, after=_described(config))
    return config


@router.delete("/{name}/evaluation", response_model=EvaluationOut, responses=_EVALUATION_ERRORS)
def delete_evaluation(
    name: AdapterPath, principal: PrincipalDep, evaluations: EvaluationsDep, audit: TenantAuditDep
) -> EvaluationOut:
    """Detach the evaluation: promotes no longer need a result. Returns what was attached."""
    config = evaluations.delete(principal.tenant, name)
    audit(AuditAction.ADAPTER_POLICY, name, before=_described(config))
    return config


def _described(config: EvaluationOut) -> str:
    return (
        f"evaluation {config.file_id} {config.metric.value} margin {config.margin} "
        f"max_tokens {config.max_tokens}"
    )


@router.put(
    "/{name}/versions/{version}/evaluation",
    response_model=EvaluationResult,
    responses=error_responses(400, 401, 403, 404, 409, 422),
)
def record_evaluation(
    name: AdapterPath,
    version: Annotated[int, PathParam(ge=1, le=MAX_VERSION)],
    body: EvaluationCounts,
    principal: PrincipalDep,
    evaluations: EvaluationsDep,
) -> EvaluationResult:
    """Store a run's counts as the version's result (the gateway's
    POST /v1/adapters/{name}/evaluations calls this); the registry computes the scores and
    ``passed`` with the current margin. 409 when the evaluation or the served version
    changed during the run."""
    return evaluations.record(principal.tenant, name, version, body)
