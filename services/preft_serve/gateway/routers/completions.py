"""OpenAI-compatible completion endpoints (the work is in ``gateway.completion_handler``).

These two routes take only the request: authentication runs in the handler
(:func:`deps.authenticate`) instead of as FastAPI dependencies, whose solving cost ~20% of
the gateway's in-process CPU per completion; the document still names the security scheme.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from preft_serve.common.errors import error_responses
from preft_serve.gateway import completion_handler as completions
from preft_serve.gateway.deps import authenticate
from preft_serve.gateway.openapi import CHAT_BODY, COMPLETION_BODY, OK_RESPONSE

router = APIRouter(prefix="/v1", tags=["completions"])
RESPONSES = {**OK_RESPONSE, **error_responses(400, 401, 404, 413, 429, 502, 503)}
SECURITY: dict[str, Any] = {"security": [{"TenantApiKey": []}]}


async def serve(request: Request, path: str, chat: bool) -> Response:
    """One completion: authenticate, then ``gateway.completion_handler.handle`` (also what
    ``gateway.fast_path`` calls for these routes)."""
    state = request.app.state.gateway
    owner = await authenticate(state, request)
    return await completions.handle(state, owner.tenant, request, path, chat=chat)


@router.post("/chat/completions", responses=RESPONSES, openapi_extra={**CHAT_BODY, **SECURITY})
async def chat_completions(request: Request) -> Response:
    """Chat completion with the adapter named by ``model`` or bound to ``user``."""
    return await serve(request, "/v1/chat/completions", chat=True)


@router.post("/completions", responses=RESPONSES, openapi_extra={**COMPLETION_BODY, **SECURITY})
async def text_completions(request: Request) -> Response:
    """Text completion with the adapter named by ``model`` or bound to ``user``."""
    return await serve(request, "/v1/completions", chat=False)
