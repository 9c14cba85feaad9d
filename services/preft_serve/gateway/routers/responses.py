"""OpenAI's Responses API (``POST /v1/responses``; the work is in
``gateway.responses_handler``), with the completion routes' adapter selection."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from preft_serve.common.errors import error_responses
from preft_serve.gateway import responses_handler
from preft_serve.gateway.openapi import RESPONSES_BODY, RESPONSES_OK
from preft_serve.gateway.routers.completions import SECURITY

router = APIRouter(prefix="/v1", tags=["completions"])


@router.post(
    "/responses",
    openapi_extra={**RESPONSES_BODY, **SECURITY},
    responses={**RESPONSES_OK, **error_responses(400, 401, 404, 413, 429, 502, 503)},
)
async def create_response(request: Request) -> Response:
    """A response with the adapter named by ``model`` or bound to ``user``."""
    return await responses_handler.serve(request)
