"""Running an adapter's evaluation: every example through this gateway's own completion
path, for the staged version and the serving one, scored, reported to the registry.

Each example is a ``/v1/chat/completions`` request sent into this gateway's own ASGI app
with the caller's key: the same authentication, rate limits, routing, two-pool handoff,
proxy and workers as any client's request, so a version is scored with exactly the PreFT
semantics it will be served with (``name@version`` pins each version; greedy, so a score
is reproducible). The requests are billed and counted like any other. At most
``CONCURRENCY`` examples run at once, and the file is bounded
(``common.evaluation_wire``), so a run is short enough to answer synchronously.

Metric ``loss`` scores the expected answers instead, with PreFT semantics
(``gateway.evaluation_loss``).

The registry decides: it stores the counts (or sums) as the version's result, computes
``passed`` with the config's margin, and its promote route re-checks that result.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response

from preft_serve.common.evaluation_wire import (
    MAX_EVAL_BYTES,
    Example,
    Metric,
    correct,
    parse_examples,
)
from preft_serve.gateway import evaluation_loss
from preft_serve.gateway.evaluation_calls import CONCURRENCY, Refused, error, post
from preft_serve.gateway.registry_proxy import call
from preft_serve.gateway.state import GatewayState

__all__ = ["EvaluateIn", "EvaluationRun", "Refused", "relay", "run"]
MAX_VERSION = 999_999_999
_CALL_TIMEOUT_S = 600.0


class EvaluateIn(BaseModel):
    model_config = {"extra": "forbid"}

    version: int | None = Field(
        None,
        ge=1,
        le=MAX_VERSION,
        description="The version to evaluate; default: the newest staged version",
        examples=[2],
    )
    promote: bool = Field(
        False, description="Promote it (serve it to every user) if it passes the gate"
    )


class EvaluationRun(BaseModel):
    name: str
    version: int
    result: dict[str, Any] = Field(
        description="The stored result: metric, examples, score, serving_version, "
        "serving_score, margin, passed, evaluated_at"
    )
    promoted: bool = Field(description="Whether this run promoted the version")
    policy: dict[str, Any] | None = Field(
        None, description="The serving policy after the promote, when promoted"
    )
    promote_refused: str | None = Field(
        None,
        description="Why a passing version asked to be promoted was not: the serving "
        "policy changed while the run went on (someone promoted or split meanwhile)",
    )


async def _registry(
    state: GatewayState, request: Request, method: str, path: str, json: object = None
) -> Any:
    return (await _registry_answer(state, request, method, path, json))[0]


async def _registry_answer(
    state: GatewayState,
    request: Request,
    method: str,
    path: str,
    json: object = None,
    if_match: str | None = None,
) -> tuple[Any, httpx.Response]:
    """A registry call's payload and answer; a refusal raises :class:`Refused`."""
    answer = await call(state.registry_http, request, method, path, json, if_match)
    payload = _payload(answer)
    if answer.status_code >= 400:
        raise _refused(answer, payload)
    return payload, answer


def _refused(answer: httpx.Response, payload: Any) -> Refused:
    return Refused(answer.status_code, payload, answer.headers.get("retry-after"))


def _payload(answer: httpx.Response) -> Any:
    try:
        return orjson.loads(answer.content)
    except orjson.JSONDecodeError:
        return {"error": {"message": answer.text[:500], "code": "registry_error"}}


async def _file(state: GatewayState, request: Request, file_id: str) -> list[Example]:
    answer = await call(state.registry_http, request, "GET", f"/v1/files/{file_id}/content")
    if answer.status_code >= 400:
        raise _refused(answer, _payload(answer))
    if len(answer.content) > MAX_EVAL_BYTES:
        raise error(400, f"evaluation file {file_id} exceeds {MAX_EVAL_BYTES} bytes", "file")
    try:
        return parse_examples(answer.content)
    except ValueError as exc:  # changed since it was attached? it cannot: files are immutable
        raise error(400, f"evaluation file {file_id}: {exc}", "invalid_file_format") from None


def _pick_version(policy: dict[str, Any], wanted: int | None, name: str) -> int:
    versions = {int(v["version"]): v["state"] for v in policy["versions"]}
    if wanted is None:
        staged = [v for v, s in versions.items() if s == "staged"]
        if not staged:
            raise error(
                400,
                f"adapter {name!r} has no staged version; upload one with ?promote=false "
                "or name a version",
                "no_staged_version",
            )
        return max(staged)
    if wanted not in versions:
        raise error(
            404,
            f"adapter {name!r} has no version {wanted}; its versions are "
            f"{min(versions)} to {max(versions)}",
            "not_found",
        )
    return wanted


async def _answer(
    client: httpx.AsyncClient, model: str, example: Example, max_tokens: int, line: int
) -> str:
    body = {
        "model": model,
        "messages": example.messages,
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    payload = await post(client, "/v1/chat/completions", body, model, line)
    content = payload["choices"][0]["message"].get("content")
    return content if isinstance(content, str) else ""


async def _count(
    client: httpx.AsyncClient,
    model: str,
    examples: list[Example],
    metric: Metric,
    max_tokens: int,
) -> int:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(line: int, example: Example) -> bool:
        async with gate:
            answer = await _answer(client, model, example, max_tokens, line)
        return correct(metric, answer, example.expected)

    scored = await asyncio.gather(*(one(n, e) for n, e in enumerate(examples, 1)))
    return sum(scored)


async def run(state: GatewayState, request: Request, name: str, body: EvaluateIn) -> EvaluationRun:
    """Evaluate one version against the serving one, store the result, promote if asked
    and passed. Raises :class:`Refused` with the answer for the client otherwise."""
    config = await _registry(state, request, "GET", f"/v1/adapters/{name}/evaluation")
    policy, read = await _registry_answer(state, request, "GET", f"/v1/adapters/{name}/policy")
    version = _pick_version(policy, body.version, name)
    serving = int(policy["version"])
    examples = await _file(state, request, config["file_id"])
    metric, max_tokens = Metric(config["metric"]), int(config["max_tokens"])
    headers = {"authorization": request.headers.get("authorization", "")}
    transport = httpx.ASGITransport(app=request.app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://gateway", headers=headers, timeout=_CALL_TIMEOUT_S
    ) as client:
        if metric is Metric.LOSS:
            measured = await evaluation_loss.measure_loss(client, name, version, serving, examples)
        else:
            right = await _count(client, f"{name}@{version}", examples, metric, max_tokens)
            serving_right = (
                right
                if serving == version
                else await _count(client, f"{name}@{serving}", examples, metric, max_tokens)
            )
            measured = {"correct": right, "serving_correct": serving_right}
    result = await _registry(
        state,
        request,
        "PUT",
        f"/v1/adapters/{name}/versions/{version}/evaluation",
        {
            "file_id": config["file_id"],
            "metric": metric.value,
            "examples": len(examples),
            "serving_version": serving,
            **measured,
        },
    )
    promoted, refused = None, None
    if body.promote and result["passed"] and version != serving:
        # Only onto the policy this run was measured against (a promote ends any split:
        # one set during the run must not vanish unseen).
        try:
            promoted, _ = await _registry_answer(
                state,
                request,
                "POST",
                f"/v1/adapters/{name}/versions/{version}/promote",
                if_match=read.headers.get("etag"),
            )
        except Refused as exc:
            if exc.status != 412:
                raise
            refused = _message(exc.payload)
    return EvaluationRun(
        name=name,
        version=version,
        result=result,
        promoted=promoted is not None,
        policy=promoted,
        promote_refused=refused,
    )


def _message(payload: Any) -> str:
    error = payload.get("error") if isinstance(payload, dict) else None
    text = error.get("message") if isinstance(error, dict) else None
    return str(text) if text else "the serving policy changed during the run"


def relay(refused: Refused) -> Response:
    """The refusal as the client's answer (the registry's or a worker's envelope)."""
    headers = {"Retry-After": refused.retry_after} if refused.retry_after else None
    return Response(
        orjson.dumps(refused.payload),
        refused.status,
        headers=headers,
        media_type="application/json",
    )
