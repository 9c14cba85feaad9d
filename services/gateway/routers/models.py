"""``GET /v1/models``: the tenant's adapters plus the base model."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from preft_serve.common.errors import error_responses
from preft_serve.gateway.deps import StateDep, TenantDep

router = APIRouter(prefix="/v1", tags=["models"])


@router.get("/models", responses=error_responses(401))
async def list_models(state: StateDep, owner: TenantDep) -> dict[str, Any]:
    """The tenant's adapters (first ``models_list_limit`` in name order), base model last."""
    names = await state.registry.adapter_names(owner.tenant, state.settings.models_list_limit)
    data = [{"id": n, "object": "model", "owned_by": owner.tenant} for n in names]
    data.append({"id": state.settings.base_model_name, "object": "model",
                 "owned_by": "preft-serve"})
    return {"object": "list", "data": data}
