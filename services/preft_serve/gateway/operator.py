"""What the operator view reads of this gateway: its workers (health, load, resident
adapters) and its routing and handoff counts, plus the admin-token check that guards it.

All of it is what this gateway process already holds (the pool monitor's last rounds and
its own Prometheus counters since it started), so reading it costs no call to a worker.
Several gateway replicas each report their own share; Prometheus sums them.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Literal
from urllib.parse import urlsplit, urlunsplit

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from preft_serve.common.access_log import access_fields
from preft_serve.common.errors import ServiceError, Unauthorized
from preft_serve.gateway.deps import StateDep
from preft_serve.gateway.metrics import GatewayMetrics
from preft_serve.gateway.routing import RouteResult, WorkerPool

Pool = Literal["prefill", "decode"]
HANDOFF_RESULTS = ("decoded", "first_token", "fallback", "decode_failed")
UNIFIED_REASONS = ("all_token_adapter", "one_token", "option")
MAX_PAGE = 200
MAX_RESIDENT = 1000

_admin_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="AdminToken",
    description="The deployment's admin token (the registry's)",
)


class OperatorNotConfigured(ServiceError):
    """The operator routes exist, but this gateway was given no admin token to check."""

    http_status = 501
    code = "operator_not_configured"


async def require_admin(
    request: Request,
    state: StateDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_admin_bearer)],
) -> None:
    """The bearer must be the admin token (compared in constant time); a tenant's API key
    is not, whatever its role: 401."""
    expected = state.settings.admin_token
    if expected is None:
        raise OperatorNotConfigured(
            f"{request.url.path} is not enabled on this deployment: the gateway has no "
            "admin token configured"
        )
    if credentials is None:
        raise Unauthorized(
            "missing credentials: send 'Authorization: Bearer <admin token>'",
            code="missing_admin_token",
        )
    given = credentials.credentials.encode()
    if not hmac.compare_digest(given, expected.get_secret_value().encode()):
        state.metrics.errors.labels("invalid_admin_token").inc()
        raise Unauthorized("invalid admin token", code="invalid_admin_token")
    access_fields(request)["admin"] = True


AdminDep = Annotated[None, Depends(require_admin)]


class WorkerView(BaseModel):
    url: str = Field(description="The worker's base URL (any user:password part removed)")
    pool: Pool = Field(description="prefill: serves adapters; decode: continues handoffs")
    healthy: bool
    failures: int = Field(description="Consecutive failed health checks or connections")
    inflight: int = Field(description="This gateway's open requests on the worker")
    others: int = Field(description="Other gateways' requests on it at the last load poll")
    resident_count: int = Field(description="Adapters the worker reported loaded")
    resident: list[str] = Field(description="Their sha256s, sorted, at most `adapters` of them")


class WorkerPage(BaseModel):
    object: Literal["list"] = "list"
    pool: Pool
    total: int = Field(description="Workers in the pool")
    healthy: int = Field(description="Of them, in service")
    cap: int | None = Field(description="Requests a worker may hold before new ones spill")
    data: list[WorkerView]
    has_more: bool
    last: str | None = Field(description="Pass as `after` for the next page")


class RoutingView(BaseModel):
    decisions: dict[str, int] = Field(
        description="Routing decisions by result: resident (the worker had the adapter "
        "loaded), preferred, replica, spill"
    )
    warm_hit_share: float | None = Field(
        description="resident / all decisions (null before the first adapter request)"
    )
    handoffs: dict[str, int] = Field(
        description="Requests by handoff result: decoded, first_token, fallback, decode_failed"
    )
    unified: dict[str, int] = Field(
        description="Requests a gateway with a decode pool served on one worker, by why"
    )
    decode_pool: bool = Field(description="Whether this gateway has a decode pool")
    started_at: int = Field(description="Unix seconds this gateway started: counts are since")


def public_url(url: str) -> str:
    """``url`` without a ``user:password@`` part (a worker URL may carry one)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def worker_page(
    pool: WorkerPool, name: Pool, limit: int, after: str | None, adapters: int
) -> WorkerPage:
    """Workers sorted by (public) URL, ``limit`` of them after ``after``, each with at most
    ``adapters`` resident shas."""
    shown = sorted((public_url(u), u) for u in pool.workers)
    if after is not None:
        shown = [(p, u) for p, u in shown if p > after]
    page, more = shown[:limit], len(shown) > limit
    rows = []
    for public, url in page:
        status = pool.status[url]
        rows.append(
            WorkerView(
                url=public,
                pool=name,
                healthy=pool.is_healthy(url),
                failures=status.failures,
                inflight=status.inflight,
                others=status.others,
                resident_count=len(status.resident),
                resident=sorted(status.resident)[:adapters],
            )
        )
    return WorkerPage(
        pool=name,
        total=len(pool.workers),
        healthy=sum(map(pool.is_healthy, pool.workers)),
        cap=pool.cap() if pool.workers else None,
        data=rows,
        has_more=more,
        last=page[-1][0] if more else None,
    )


def _counts(
    metrics: GatewayMetrics, family: str, label: str, values: tuple[str, ...]
) -> dict[str, int]:
    """A counter family's values by label, from this gateway's own registry."""
    found = {}
    for value in values:
        sample = metrics.registry.get_sample_value(f"{family}_total", {label: value})
        found[value] = int(sample or 0)
    return found


def routing_view(metrics: GatewayMetrics, decode_pool: bool, started_at: int) -> RoutingView:
    decisions = _counts(
        metrics, "preft_gateway_routing", "result", tuple(r.value for r in RouteResult)
    )
    total = sum(decisions.values())
    return RoutingView(
        decisions=decisions,
        warm_hit_share=decisions[RouteResult.RESIDENT.value] / total if total else None,
        handoffs=_counts(metrics, "preft_gateway_handoffs", "result", HANDOFF_RESULTS),
        unified=_counts(metrics, "preft_gateway_unified", "reason", UNIFIED_REASONS),
        decode_pool=decode_pool,
        started_at=started_at,
    )
