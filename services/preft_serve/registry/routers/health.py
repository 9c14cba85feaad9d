"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import logging

import redis
from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from preft_serve.common.errors import ServiceUnavailable, error_responses
from preft_serve.common.objectstore import ObjectStoreError, StoreUnavailable
from preft_serve.registry.deps import StateDep

logger = logging.getLogger(__name__)
router = APIRouter(tags=["ops"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", responses=error_responses(503))
def readyz(state: StateDep) -> dict[str, str]:
    """Redis and the object store are reachable."""
    try:
        state.redis.ping()
    except redis.RedisError as exc:
        raise ServiceUnavailable(f"Redis is not reachable: {exc}") from None
    try:
        state.store.check()
    except ObjectStoreError as exc:
        logger.warning("not ready: %s", exc)  # the detail (path, errno) stays in the log
        reason = exc.reason if isinstance(exc, StoreUnavailable) else "it failed a check"
        raise ServiceUnavailable(f"the object store is unavailable: {reason}") from None
    return {"status": "ready"}


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    return Response(
        generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )
