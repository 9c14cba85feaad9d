"""``POST /v1/adapters/{name}/evaluations``: run the adapter's evaluation gate on a version
(``gateway.evaluation``). The gateway's own route, not a forwarded one: it needs the
serving path. Included before the adapters router, whose catch-all forwards the rest."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from preft_serve.common.errors import BadRequest, error_responses
from preft_serve.common.registry_client.contract import is_adapter_name
from preft_serve.gateway import evaluation
from preft_serve.gateway.deps import StateDep, TenantDep
from preft_serve.gateway.routers.forwarded import FORWARD_ERRORS

router = APIRouter(prefix="/v1/adapters", tags=["adapters"])


@router.post(
    "/{name}/evaluations",
    response_model=evaluation.EvaluationRun,
    responses=error_responses(400, 404, 409, 422, 502, *FORWARD_ERRORS),
)
async def evaluate(
    name: str,
    body: evaluation.EvaluateIn,
    request: Request,
    state: StateDep,
    owner: TenantDep,
) -> evaluation.EvaluationRun | Response:
    """Serve every example of the adapter's evaluation file (PUT
    /v1/adapters/{name}/evaluation) to a version and to the serving version, through this
    gateway's completion path (greedy, ``name@version``; for metric loss, the expected
    answer scored with PreFT semantics instead), score both, store the result on
    the version and, with ``promote``, promote it if it is not worse than the serving
    version by more than the margin. Synchronous: at most 200 examples, a few at a time;
    each completion is billed and rate-limited like any other."""
    del owner  # the key's role is checked by the dependency; the registry scopes the rest
    if not is_adapter_name(name):
        raise BadRequest(f"{name[:64]!r} is not an adapter name", param="name")
    try:
        return await evaluation.run(state, request, name, body)
    except evaluation.Refused as refused:
        return evaluation.relay(refused)
