"""``GET /v1/models`` (the tenant's adapters plus the base model) and ``GET
/v1/models/{model}`` (one of them), as OpenAI model objects."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from preft_serve.common.errors import NotFound, error_responses
from preft_serve.common.registry_client import AdapterRef
from preft_serve.gateway.deps import StateDep, TenantDep
from preft_serve.gateway.state import GatewayState

router = APIRouter(prefix="/v1", tags=["models"])
BASE_OWNER = "preft-serve"


def _adapter(ref: AdapterRef) -> dict[str, Any]:
    return {"id": ref.name, "object": "model", "created": ref.created, "owned_by": ref.tenant}


def _base(state: GatewayState) -> dict[str, Any]:
    return {"id": state.settings.base_model_name, "object": "model",
            "created": state.started_at, "owned_by": BASE_OWNER}


@router.get("/models", responses=error_responses(401))
async def list_models(state: StateDep, owner: TenantDep) -> dict[str, Any]:
    """The tenant's adapters (first ``models_list_limit`` in name order), base model last.
    ``created``: when the adapter was first uploaded (the base model: when this gateway
    started), unix seconds."""
    refs = await state.registry.adapters(owner.tenant, state.settings.models_list_limit)
    return {"object": "list", "data": [*map(_adapter, refs), _base(state)]}


@router.get("/models/{model:path}", responses=error_responses(401, 404))
async def get_model(model: str, state: StateDep, owner: TenantDep) -> dict[str, Any]:
    """One of the tenant's adapters, or the base model. Another tenant's adapter gets the
    same 404 as a name that exists nowhere."""
    if model == state.settings.base_model_name:
        return _base(state)
    ref = await state.registry.resolve_adapter(owner.tenant, model)
    if ref is None:
        raise NotFound(f"model '{model}' does not exist; GET /v1/models lists yours",
                       code="model_not_found", param="model")
    return _adapter(ref)
