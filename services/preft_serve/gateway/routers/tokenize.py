"""vLLM's ``POST /tokenize``, ``POST /detokenize`` and ``GET /version``, passed through to a
worker, so clients written against a vLLM server keep working behind the gateway.

Every adapter shares the base model's tokenizer (adapters change weights, not the
vocabulary), so a worker tokenizes with the base model: ``model`` is still resolved as for
a completion (another tenant's or an unknown name is the same 404), but the worker sees its
base model's name, never an adapter it would load only to tokenize.

They cost the worker what a completion's prompt does, so they are held to a completion's
bounds with the same pieces: the body limit (413, the app's middleware), the tenant's and
user's rate limits (429, ``completion_handler.charge``: one request each, no output
tokens), the pool's admission (``proxy.open_upstream``: in flight on the worker, refused
with 503 when the gateway holds its most), and a token-id list no longer than a
completion's token-id prompt may be nor the workers' context (400 before any worker sees
it). A prompt's tokens are counted by the worker, which refuses one longer than its
context (``worker.vllm_compat.tokenization``), and ids outside its vocabulary.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from fastapi import APIRouter, Request, Response

from preft_serve.common.access_log import access_fields, request_id_of
from preft_serve.common.errors import BadRequest, ServiceUnavailable, error_responses
from preft_serve.gateway.completion_handler import charge
from preft_serve.gateway.deps import StateDep, TenantDep
from preft_serve.gateway.openapi import DETOKENIZE_BODY, TOKENIZE_BODY
from preft_serve.gateway.proxy import BadGateway, open_upstream, read_whole, worker_error
from preft_serve.gateway.selection import select_target
from preft_serve.gateway.state import GatewayState
from preft_serve.gateway.validation import check_names, parse_body

router = APIRouter(tags=["tokenizer"])
SECURITY: dict[str, Any] = {"security": [{"TenantApiKey": []}]}
ERRORS = error_responses(400, 401, 404, 413, 429, 502, 503)


def _check_token_ids(body: dict[str, Any], state: GatewayState) -> None:
    """``/detokenize``'s ``tokens``: a list of token ids, at most what a completion's
    token-id prompt may hold and what the workers' context holds (once known)."""
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens
    ):
        raise BadRequest(
            "'tokens' must be a list of token ids (non-negative integers)", param="tokens"
        )
    caps = state.caps
    limit, what = caps.max_prompt_token_ids, "this gateway accepts in one prompt"
    context = caps.context.max_model_len if caps.context is not None else None
    if context is not None and context < limit:
        limit, what = context, "the model's context length"
    if len(tokens) > limit:
        raise BadRequest(
            f"'tokens' holds {len(tokens)} token ids, more than the {limit} "
            f"{what}; send at most {limit}",
            param="tokens",
            code="context_length_exceeded" if limit == context else None,
        )


def _check_tokenize_body(body: dict[str, Any]) -> None:
    """``/tokenize``'s text: ``prompt`` a string, ``messages`` a non-empty list (the shapes
    its OpenAPI document states), refused here rather than handed to a worker."""
    if "prompt" in body and not isinstance(body["prompt"], str):
        raise BadRequest("'prompt' must be a string (the text to tokenize)", param="prompt")
    messages = body.get("messages")
    if "messages" in body and not (isinstance(messages, list) and messages):
        raise BadRequest("'messages' must be a non-empty list of chat messages", param="messages")


async def _pass_through(state: GatewayState, tenant: str, request: Request, path: str) -> Response:
    body = parse_body(await request.body(), state.caps.max_json_depth)
    check_names(body)
    if path == "/detokenize":
        _check_token_ids(body, state)
    else:
        _check_tokenize_body(body)
    state.pool.tenant_open.check(tenant)  # before the charge: a refusal costs nothing
    _, model = await charge(state, tenant, request, body, 0, access_fields(request))
    if model is not None:  # resolved as for a completion: an unknown name is its 404
        await select_target(
            state.registry,
            tenant,
            model,
            None,
            base_name=state.settings.base_model_name,
            worker_base_model=state.settings.worker_model,
        )
    body["model"] = state.settings.worker_model
    upstream = await open_upstream(
        state.calls, state.pool, path, path, body, request_id_of(request), tenant=tenant
    )
    status = upstream.response.status_code
    try:
        payload = orjson.loads(await read_whole(upstream))
    except orjson.JSONDecodeError:
        raise BadGateway(
            f"worker {upstream.worker} answered {path} with something other than JSON"
        ) from None
    if status >= 400:
        payload = worker_error(payload, status) or payload
        error = payload.get("error") if isinstance(payload, dict) else None
        if (
            path == "/tokenize"
            and isinstance(error, dict)
            and (error.get("code") == "context_length_exceeded")
        ):
            # vLLM names its own stage (input_tokens, input_text), not the client's field.
            error["param"] = "messages" if "messages" in body else "prompt"
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


@router.post("/tokenize", openapi_extra={**TOKENIZE_BODY, **SECURITY}, responses=ERRORS)
async def tokenize(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """Token ids of ``prompt`` (or of ``messages`` through the chat template), as vLLM's
    ``/tokenize``."""
    return await _pass_through(state, owner.tenant, request, "/tokenize")


@router.post("/detokenize", openapi_extra={**DETOKENIZE_BODY, **SECURITY}, responses=ERRORS)
async def detokenize(request: Request, state: StateDep, owner: TenantDep) -> Response:
    """The text of ``tokens``, as vLLM's ``/detokenize``."""
    return await _pass_through(state, owner.tenant, request, "/detokenize")


@router.get("/version", openapi_extra=SECURITY, responses=error_responses(401, 429, 503))
async def version(request: Request, state: StateDep, owner: TenantDep) -> dict[str, Any]:
    """The workers' vLLM version (``{"version": ...}``), from a healthy worker."""
    await charge(state, owner.tenant, request, {}, 0, access_fields(request))
    for worker in state.pool.choose(VERSION).order:
        with state.pool.track(worker):
            try:
                answer = await state.http.get(f"{worker}{VERSION}")
                found = answer.json() if answer.status_code == 200 else None
            except (httpx.HTTPError, ValueError):  # unreachable, or not JSON: the next one
                continue
        if isinstance(found, dict):
            return found
    raise ServiceUnavailable("no worker answered /version; retry shortly")


VERSION = "/version"
