"""``GET /v1/models`` (the tenant's adapters plus the base model), ``GET
/v1/models/{model}`` (one of them), as OpenAI model objects, and ``DELETE
/v1/models/{model}`` (an adapter, deleted by the registry)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from preft_serve.common.errors import BadRequest, error_responses
from preft_serve.common.registry_client import AdapterRef, is_adapter_name, split_pinned
from preft_serve.gateway.deps import StateDep, TenantDep
from preft_serve.gateway.registry_proxy import call
from preft_serve.gateway.selection import model_not_found
from preft_serve.gateway.state import GatewayState

router = APIRouter(prefix="/v1", tags=["models"])
BASE_OWNER = "preft-serve"


def _adapter(ref: AdapterRef) -> dict[str, Any]:
    return {"id": ref.name, "object": "model", "created": ref.created, "owned_by": ref.tenant}


def _base(state: GatewayState) -> dict[str, Any]:
    return {
        "id": state.settings.base_model_name,
        "object": "model",
        "created": state.started_at,
        "owned_by": BASE_OWNER,
    }


@router.get("/models", responses=error_responses(401))
async def list_models(state: StateDep, owner: TenantDep) -> dict[str, Any]:
    """The tenant's adapters (first ``models_list_limit`` in name order), base model last.
    ``created``: when the adapter was first uploaded (the base model: when this gateway
    started), unix seconds."""
    refs = await state.registry.adapters(owner.tenant, state.settings.models_list_limit)
    return {"object": "list", "data": [*map(_adapter, refs), _base(state)]}


@router.get("/models/{model:path}", responses=error_responses(401, 404))
async def get_model(model: str, state: StateDep, owner: TenantDep) -> dict[str, Any]:
    """One of the tenant's adapters (``name@version``: one version of it), or the base
    model. Another tenant's adapter gets the same 404 as a name that exists nowhere."""
    if model == state.settings.base_model_name:
        return _base(state)
    ref = await state.registry.resolve_adapter(owner.tenant, model)
    if ref is None:
        raise await model_not_found(state.registry, owner.tenant, model)
    return {**_adapter(ref), "id": model}  # "carol@2" reads back as asked


@router.delete("/models/{model:path}", responses=error_responses(400, 401, 403, 404, 409, 501, 503))
async def delete_model(model: str, request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Delete one of the tenant's adapters, every version (a fine-tuned model: the job's
    ``fine_tuned_model``). The registry deletes it, as ``DELETE /v1/adapters/{name}``, with
    the tenant's key: the same check, and the same 409 while users are bound to it
    (``?force=true`` unbinds them)."""
    if model == state.settings.base_model_name:
        raise BadRequest(
            f"'{model}' is the base model; only your adapters can be deleted",
            code="model_not_deletable",
            param="model",
        )
    if (pinned := split_pinned(model)) is not None:
        raise BadRequest(
            f"versions are not deleted one by one; delete '{pinned[0]}' (all "
            "its versions), or roll it back with POST "
            f"/v1/adapters/{pinned[0]}/rollback",
            param="model",
        )
    if not is_adapter_name(model):
        raise await model_not_found(state.registry, owner.tenant, model)
    force = "?force=true" if request.query_params.get("force") == "true" else ""
    answer = await call(state.registry_http, request, "DELETE", f"/v1/adapters/{model}{force}")
    if answer.status_code == 204:
        return JSONResponse({"id": model, "object": "model", "deleted": True})
    return Response(
        answer.content,
        status_code=answer.status_code,
        media_type=answer.headers.get("content-type"),
    )
