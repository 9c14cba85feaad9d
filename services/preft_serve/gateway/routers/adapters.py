"""The registry's adapter routes, forwarded (``gateway.registry_proxy``): upload, versions
(staged, or the hot swap), list, show, delete, rollback, download, the evaluation config,
and whatever else the registry serves under ``/v1/adapters``
(``forwarded.forward_the_rest``)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from preft_serve.common.errors import error_responses
from preft_serve.common.evaluation_wire import (
    MAX_EVAL_TOKENS,
    MAX_EXAMPLES,
    MAX_LOSS_MARGIN,
    Metric,
)
from preft_serve.gateway.deps import StateDep, TenantDep
from preft_serve.gateway.openapi import (
    ADAPTER_UPLOAD_BODY,
    ADAPTER_VERSION_BODY,
    json_object_body,
    json_reply,
    typed_query,
    with_query,
)
from preft_serve.gateway.registry_proxy import forward
from preft_serve.gateway.routers.forwarded import FORWARD_ERRORS, forward_the_rest

router = APIRouter(prefix="/v1/adapters", tags=["adapters"])
STRICT = (
    "boolean",
    "Refuse the upload (422) instead of accepting it with warnings, e.g. when its "
    "base_model_name_or_path names another model",
)
UPLOADED = {
    **json_reply("The new version (201), or the identical current one (200)", 201),
    **json_reply("Identical content already uploaded: unchanged"),
}
UPLOAD_ERRORS = (400, 408, 409, 413, 415, 422)


@router.post(
    "",
    status_code=201,
    openapi_extra=with_query(ADAPTER_UPLOAD_BODY, strict=STRICT),
    responses={**UPLOADED, **error_responses(*UPLOAD_ERRORS, *FORWARD_ERRORS)},
)
async def upload_adapter(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Upload a new adapter (version 1); streamed to the registry, which checks it
    against the base model. Re-uploading identical content is a no-op (200)."""
    return await forward(state.registry_http, request, owner)


@router.get(
    "",
    openapi_extra=typed_query(
        limit=("integer", "At most this many (1-1000, default 100)"),
        cursor=("string", "next_cursor of the previous page"),
    ),
    responses={**json_reply("items and next_cursor"), **error_responses(400, *FORWARD_ERRORS)},
)
async def list_adapters(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Your adapters, by name, a page at a time."""
    return await forward(state.registry_http, request, owner)


@router.get(
    "/{name}",
    responses={
        **json_reply("The current version and the whole version history"),
        **error_responses(400, 404, *FORWARD_ERRORS),
    },
)
async def get_adapter(name: str, request: Request, state: StateDep, owner: TenantDep) -> Response:
    return await forward(state.registry_http, request, owner)


@router.put(
    "/{name}",
    status_code=201,
    openapi_extra=with_query(ADAPTER_VERSION_BODY, strict=STRICT),
    responses={**UPLOADED, **error_responses(*UPLOAD_ERRORS, 404, *FORWARD_ERRORS)},
)
async def upload_version(
    name: str, request: Request, state: StateDep, owner: TenantDep
) -> Response:
    """Upload the next version: staged, or with ?promote=true the hot swap (bound users
    move to it at once)."""
    return await forward(state.registry_http, request, owner)


@router.delete(
    "/{name}",
    status_code=204,
    openapi_extra=typed_query(force=("boolean", "Also unbind users bound to it")),
    responses={204: {"description": "Deleted"}, **error_responses(400, 404, 409, *FORWARD_ERRORS)},
)
async def delete_adapter(
    name: str, request: Request, state: StateDep, owner: TenantDep
) -> Response:
    """Delete the adapter and every version; 409 while users are bound to it (unless
    ``force``)."""
    return await forward(state.registry_http, request, owner)


@router.post(
    "/{name}/rollback",
    status_code=201,
    openapi_extra=json_object_body(
        {"version": {"type": "integer", "minimum": 1}},
        ("version",),
        "The earlier version whose content becomes current again",
    ),
    responses={
        **json_reply("The new version (201), or the current one when identical (200)", 201),
        **error_responses(400, 404, 408, 422, *FORWARD_ERRORS),
    },
)
async def rollback_adapter(
    name: str, request: Request, state: StateDep, owner: TenantDep
) -> Response:
    """Make an earlier version's content current again, as the next version."""
    return await forward(state.registry_http, request, owner)


@router.get(
    "/{name}/download",
    openapi_extra=typed_query(version=("integer", "Default: the current version")),
    responses={
        200: {
            "description": "A .tar.gz with adapter_config.json and adapter_model.safetensors "
            "at its root, as stored; X-Preft-Version and X-Preft-Sha256 name the version",
            "content": {"application/gzip": {}},
        },
        **error_responses(400, 404, 422, *FORWARD_ERRORS),
    },
)
async def download_adapter(
    name: str, request: Request, state: StateDep, owner: TenantDep
) -> Response:
    """The stored files of one version (the export); uploading them again gives the same
    sha256."""
    return await forward(state.registry_http, request, owner)


EVALUATION = "The evaluation: file_id, metric, margin, max_tokens, examples, updated_at"


@router.get(
    "/{name}/evaluation",
    responses={**json_reply(EVALUATION), **error_responses(400, 404, *FORWARD_ERRORS)},
)
async def get_evaluation(
    name: str, request: Request, state: StateDep, owner: TenantDep
) -> Response:
    """The adapter's evaluation gate; each version's result is in its policy listing."""
    return await forward(state.registry_http, request, owner)


@router.put(
    "/{name}/evaluation",
    openapi_extra=json_object_body(
        {
            "file_id": {"type": "string", "minLength": 1, "maxLength": 64},
            "metric": {"type": "string", "enum": [m.value for m in Metric]},
            "margin": {"type": "number", "minimum": 0, "maximum": MAX_LOSS_MARGIN},
            "max_tokens": {"type": "integer", "minimum": 1, "maximum": MAX_EVAL_TOKENS},
        },
        ("file_id", "metric", "margin"),
        f"A chat JSONL file of yours (at most {MAX_EXAMPLES} lines, each ending with the "
        "assistant's expected answer), the metric, and how much worse than the serving "
        "version a staged version may score (exact, contains: a share, 0 to 1; loss: nats "
        f"per answer token, 0 to {MAX_LOSS_MARGIN:g})",
    ),
    responses={**json_reply(EVALUATION), **error_responses(400, 404, 422, *FORWARD_ERRORS)},
)
async def set_evaluation(
    name: str, request: Request, state: StateDep, owner: TenantDep
) -> Response:
    """Attach an evaluation: staged versions are then promoted only with a passing result
    (POST /v1/adapters/{name}/evaluations) or with ``force=true``."""
    return await forward(state.registry_http, request, owner)


@router.delete(
    "/{name}/evaluation",
    responses={**json_reply(EVALUATION), **error_responses(400, 404, *FORWARD_ERRORS)},
)
async def delete_evaluation(
    name: str, request: Request, state: StateDep, owner: TenantDep
) -> Response:
    """Detach the evaluation: promotes no longer need a result."""
    return await forward(state.registry_http, request, owner)


forward_the_rest(router)
