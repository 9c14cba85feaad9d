"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio

import httpx
import redis
from fastapi import APIRouter, Request, Response
from preft_serve.common.errors import ServiceUnavailable, error_responses
from preft_serve.gateway.deps import StateDep
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


async def _healthy(http: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await http.get(f"{url}/health", timeout=2.0)).status_code == 200
    except httpx.HTTPError:
        return False


@router.get("/readyz", responses=error_responses(503))
async def readyz(state: StateDep) -> dict[str, object]:
    """Redis is reachable and at least one worker answers its ``/health``."""
    try:
        await state.registry.redis.ping()
    except redis.RedisError as exc:
        raise ServiceUnavailable(f"Redis is not reachable: {exc}") from None
    urls = state.pool.workers
    results = await asyncio.gather(*(_healthy(state.http, u) for u in urls))
    healthy = [u for u, ok in zip(urls, results, strict=True) if ok]
    if not healthy:
        raise ServiceUnavailable(f"no worker is healthy (checked {len(urls)})")
    return {"status": "ready", "healthy_workers": len(healthy), "workers": len(urls)}


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry),
                    media_type=CONTENT_TYPE_LATEST)
