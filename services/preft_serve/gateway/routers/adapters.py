"""The registry's adapter routes, forwarded (``gateway.registry_proxy``): upload, versions
(the hot swap), list, show, delete, rollback, download, and whatever else the registry
serves under ``/v1/adapters`` (``forwarded.forward_the_rest``)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from preft_serve.common.errors import error_responses
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
    """Upload the next version (the hot swap: bound users move to it at once)."""
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


forward_the_rest(router)
