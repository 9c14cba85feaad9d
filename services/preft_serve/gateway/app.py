"""The gateway's FastAPI application (OpenAPI at /docs)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import redis
import redis.asyncio as aioredis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from preft_serve import __version__
from preft_serve.common.access_log import AccessLogMiddleware
from preft_serve.common.errors import install_error_handlers
from preft_serve.common.registry_client import AsyncRegistryReader
from preft_serve.common.tracing import instrument_app
from preft_serve.gateway.fast_path import CompletionFastPath, redis_unavailable
from preft_serve.gateway.metrics import GatewayMetrics
from preft_serve.gateway.openapi import document_models
from preft_serve.gateway.routers import (
    adapters,
    audit,
    completions,
    console,
    evaluations,
    files,
    fine_tuning,
    health,
    keys,
    models,
    operator,
    responses,
    tokenize,
    usage,
    users,
)
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.gateway.state import GatewayState
from preft_serve.gateway.upload_limit import UploadAwareBodyLimit

logger = logging.getLogger(__name__)
ACCESS_LOGGER = "preft_serve.gateway.access"

DESCRIPTION = """\
OpenAI-compatible front door: `Authorization: Bearer <tenant API key>`. The adapter is the
one named by `model`, else the one bound to `user` (or `safety_identifier`, or the
`X-User-Id` header); `model` set to the base model's name runs the user's binding if any,
else the base model. A user with no binding and no `model` gets 404. Errors are OpenAI's
`{"error": {"message", "type", "param", "code"}}`.
Every answer carries `x-request-id` (the client's `X-Request-Id` when sane, else a new one).
`/v1/files`, `/v1/fine_tuning/jobs`, `/v1/audit`, `/v1/adapters`, `/v1/users`, `/v1/usage` and
`/v1/keys` are forwarded to the adapter registry with the same key, so this one base URL serves
everything a tenant does: upload data, train, upload and manage adapters, bind users, chat,
read usage and who changed what, and manage API keys.
"""


async def _redis_unavailable(request: Request, exc: Exception) -> JSONResponse:
    return redis_unavailable(exc, request.app.state.metrics)


def create_app(
    settings: GatewaySettings | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    registry: AsyncRegistryReader | None = None,
    redis_client: aioredis.Redis | None = None,
) -> FastAPI:
    """Build the app; ``transport``, ``registry`` and ``redis_client`` replace the real
    ones (tests; a ``registry`` without ``redis_client`` means no rate limits)."""
    settings = settings or GatewaySettings()
    metrics = GatewayMetrics(settings.metrics_max_adapters, settings.metrics_max_tenants)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            state = await GatewayState.build(
                settings,
                metrics,
                transport,
                registry,
                redis=redis_client,
                tracer_provider=tracer_provider,
            )
            app.state.gateway = state
            logger.info(
                "gateway ready: %d workers, redis namespace %s",
                len(state.pool.workers),
                settings.namespace,
            )
            try:
                yield
            finally:
                await state.aclose()
        finally:
            if tracer_provider is not None:
                # Sends the spans still queued and stops the exporter's thread (which would
                # otherwise retry an unreachable collector after the app has gone), also
                # after a failed start. In a thread: a collector that does not answer holds
                # it up to its export timeout.
                await asyncio.to_thread(tracer_provider.shutdown)

    app = FastAPI(
        title="preft-serve gateway", version=__version__, description=DESCRIPTION, lifespan=lifespan
    )
    app.state.metrics = metrics
    install_error_handlers(app)
    app.add_exception_handler(redis.RedisError, _redis_unavailable)
    # Innermost of the middlewares: completions skip FastAPI's router (see fast_path).
    app.add_middleware(CompletionFastPath)
    app.add_middleware(
        UploadAwareBodyLimit,
        max_bytes=settings.max_body_bytes,
        message=f"request body exceeds this gateway's {settings.max_body_bytes}-byte limit; "
        "send a shorter request (fewer or shorter prompts or messages)",
        # Uploads are streamed to the registry, not buffered: they get the registry's limit.
        upload_bytes=settings.max_upload_bytes,
        file_message=f"upload exceeds this gateway's {settings.max_upload_bytes}-byte limit; "
        "upload a smaller file (split the data over several files)",
        adapter_message=f"upload exceeds this gateway's {settings.max_upload_bytes}-byte "
        "limit; upload a smaller adapter (a lower rank, or fewer layers)",
    )
    # Outermost: every answer (a 413 from the body limit too) carries the request id.
    app.add_middleware(AccessLogMiddleware, logger_name=ACCESS_LOGGER)
    for module in (
        completions,
        responses,
        models,
        files,
        fine_tuning,
        audit,
        evaluations,  # before adapters: its catch-all forwards the rest of /v1/adapters
        adapters,
        users,
        usage,
        keys,
        tokenize,
        health,
        operator,  # admin token: workers, routing, tenants (read-only)
        console,  # the web console's static files at /console/
    ):
        app.include_router(module.router)
    document_models(app, *fine_tuning.BODY_MODELS)
    tracer_provider = instrument_app(app, settings.tracing) if settings.tracing_enabled else None
    return app
