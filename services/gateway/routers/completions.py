"""OpenAI-compatible completion endpoints (the work is in ``gateway.completions``)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from preft_serve.common.errors import error_responses
from preft_serve.gateway import completions
from preft_serve.gateway.deps import StateDep, TenantDep
from preft_serve.gateway.openapi import CHAT_BODY, COMPLETION_BODY, OK_RESPONSE

router = APIRouter(prefix="/v1", tags=["completions"])
RESPONSES = {**OK_RESPONSE, **error_responses(400, 401, 404, 413, 429, 502, 503)}


@router.post("/chat/completions", responses=RESPONSES, openapi_extra=CHAT_BODY)
async def chat_completions(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Chat completion with the adapter named by ``model`` or bound to ``user``."""
    return await completions.handle(state, owner.tenant, request, "/v1/chat/completions",
                                    chat=True)


@router.post("/completions", responses=RESPONSES, openapi_extra=COMPLETION_BODY)
async def text_completions(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Text completion with the adapter named by ``model`` or bound to ``user``."""
    return await completions.handle(state, owner.tenant, request, "/v1/completions",
                                    chat=False)
