"""vLLM's ``POST /tokenize``, ``POST /detokenize`` and ``GET /version``, passed through to a
worker, so clients written against a vLLM server keep working behind the gateway.

Every adapter shares the base model's tokenizer (adapters change weights, not the
vocabulary), so a worker tokenizes with the base model: ``model`` is still resolved as for
a completion (another tenant's or an unknown name is the same 404), but the worker sees its
base model's name, never an adapter it would load only to tokenize.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from fastapi import APIRouter, Request, Response

from preft_serve.common.access_log import request_id_of
from preft_serve.common.errors import BadRequest, ServiceUnavailable, error_responses
from preft_serve.gateway.deps import StateDep, TenantDep
from preft_serve.gateway.openapi import DETOKENIZE_BODY, TOKENIZE_BODY
from preft_serve.gateway.proxy import BadGateway, open_upstream, read_whole, worker_error
from preft_serve.gateway.selection import select_target
from preft_serve.gateway.state import GatewayState
from preft_serve.gateway.validation import parse_body, requested_model

router = APIRouter(tags=["tokenizer"])
SECURITY: dict[str, Any] = {"security": [{"TenantApiKey": []}]}
ERRORS = error_responses(400, 401, 404, 413, 502, 503)


async def _pass_through(state: GatewayState, tenant: str, request: Request,
                        path: str) -> Response:
    body = parse_body(await request.body(), state.caps.max_json_depth)
    model = requested_model(body, state.settings.base_model_name)
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string: one of your adapters or "
                         f"'{state.settings.base_model_name}'", param="model")
    if model is not None:  # resolved as for a completion: an unknown name is its 404
        await select_target(state.registry, tenant, model, None,
                            base_name=state.settings.base_model_name,
                            worker_base_model=state.settings.worker_model)
    body["model"] = state.settings.worker_model
    upstream = await open_upstream(state.calls, state.pool, path, path, body,
                                   request_id_of(request))
    status = upstream.response.status_code
    try:
        payload = orjson.loads(await read_whole(upstream))
    except orjson.JSONDecodeError:
        raise BadGateway(f"worker {upstream.worker} answered {path} with something other "
                         "than JSON") from None
    if status >= 400:
        payload = worker_error(payload, status) or payload
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


@router.post("/tokenize", openapi_extra={**TOKENIZE_BODY, **SECURITY}, responses=ERRORS)
async def tokenize(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Token ids of ``prompt`` (or of ``messages`` through the chat template), as vLLM's
    ``/tokenize``."""
    return await _pass_through(state, owner.tenant, request, "/tokenize")


@router.post("/detokenize", openapi_extra={**DETOKENIZE_BODY, **SECURITY},
             responses=ERRORS)
async def detokenize(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """The text of ``tokens``, as vLLM's ``/detokenize``."""
    return await _pass_through(state, owner.tenant, request, "/detokenize")


@router.get("/version", openapi_extra=SECURITY, responses=error_responses(401, 503))
async def version(state: StateDep, owner: TenantDep) -> dict[str, Any]:
    """The workers' vLLM version (``{"version": ...}``), from a healthy worker."""
    for worker in state.pool.healthy():
        try:
            answer = await state.http.get(f"{worker}/version")
            found = answer.json() if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError):  # unreachable, or not JSON: the next one
            continue
        if isinstance(found, dict):
            return found
    raise ServiceUnavailable("no worker answered /version; retry shortly")
