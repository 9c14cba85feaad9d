"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import redis
from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from preft_serve.common.errors import ServiceUnavailable, error_responses
from preft_serve.gateway.deps import StateDep

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", responses=error_responses(503))
async def readyz(state: StateDep) -> dict[str, object]:
    """Redis is reachable and at least one worker passes its health checks (as of the
    gateway's last check, so a probe does not fan out to every worker)."""
    try:
        if state.redis is not None:
            await state.redis.ping()
    except redis.RedisError as exc:
        raise ServiceUnavailable(f"Redis is not reachable: {exc}") from None
    urls = state.pool.workers
    healthy = sum(map(state.pool.is_healthy, urls))
    if not healthy:
        raise ServiceUnavailable(
            f"no worker is healthy ({len(urls)} known; discovery: "
            f"{state.monitor.source.describe()})"
        )
    return {"status": "ready", "healthy_workers": healthy, "workers": len(urls)}


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    return Response(
        generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )
