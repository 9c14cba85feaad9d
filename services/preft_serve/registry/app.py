"""The registry's FastAPI application (OpenAPI at /docs)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from preft_serve import __version__
from preft_serve.common.access_log import AccessLogMiddleware
from preft_serve.common.bodylimit import BodySizeLimitMiddleware
from preft_serve.common.errors import error_response, install_error_handlers
from preft_serve.common.objectstore import ObjectStore, ObjectStoreError, StoreFull
from preft_serve.common.registry_client import InvalidKeyPart
from preft_serve.registry.json_body_guard import JsonBodyGuardMiddleware
from preft_serve.registry.metrics import RegistryMetrics
from preft_serve.registry.request_metrics import MetricsMiddleware
from preft_serve.registry.routers import (
    adapters,
    audit,
    files,
    fine_tuning,
    health,
    keys,
    tenants,
    usage,
    users,
)
from preft_serve.registry.settings import RegistrySettings
from preft_serve.registry.state import RegistryState
from preft_serve.registry.transfer_gate import TransferGateMiddleware, TransferPace
from preft_serve.registry.transfers import TransferSlots

logger = logging.getLogger(__name__)
ACCESS_LOGGER = "preft_serve.registry.access"

DESCRIPTION = """\
Tenants upload adapters (LoRA, DiReFT, LoReFT) for the served base model, version them and
bind their users to them. Adapters are validated before anything is stored; their
identity is the sha256 of their content. Errors are always
OpenAI's `{"error": {"message", "type", "param", "code"}}` with a message that says what to fix.
"""


async def _backend_unavailable(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, StoreFull):
        # Not an outage to wait out: an operator must act (507, its own code and counter).
        logger.error("object store full: %s", exc)
        request.app.state.metrics.store_full.inc()
        return error_response(
            507,
            "store_full",
            "the object store is full, so nothing was stored; the operator must free or add space",
        )
    what = "Redis" if isinstance(exc, redis.RedisError) else "the object store"
    logger.error("%s unavailable: %s", what, exc)
    return error_response(503, "service_unavailable", f"{what} is unavailable; retry shortly")


async def _invalid_key_part(_: Request, exc: Exception) -> JSONResponse:
    # A backstop: routes check names with friendlier messages before building any key.
    return error_response(400, "invalid_value", str(exc))


def create_app(
    settings: RegistrySettings | None = None, store: ObjectStore | None = None
) -> FastAPI:
    """Build the app; clients are created in the lifespan (``store`` overrides the config)."""
    settings = settings or RegistrySettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = RegistryState.build(settings, app.state.metrics, store)
        app.state.registry = state
        state.adapters.collector.start()
        if state.finetune is not None:
            state.finetune.start()
        logger.info(
            "registry ready: base model %s, object store %r, redis namespace %s",
            state.base.describe(),
            state.store,
            settings.namespace,
        )
        try:
            yield
        finally:
            if state.finetune is not None:
                state.finetune.close()
            state.adapters.collector.stop()
            state.close()

    app = FastAPI(
        title="preft-serve adapter registry",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.metrics = RegistryMetrics()
    install_error_handlers(app)
    app.add_exception_handler(redis.RedisError, _backend_unavailable)
    app.add_exception_handler(ObjectStoreError, _backend_unavailable)
    app.add_exception_handler(InvalidKeyPart, _invalid_key_part)
    app.add_middleware(JsonBodyGuardMiddleware)  # innermost: sees bodies under the size cap
    # The key of an upload before its body; a transfer slot for each upload and download.
    app.state.transfers = TransferSlots(
        settings.max_transfers,
        settings.tenant_max_transfers,
        settings.scratch_bytes,
        settings.tenant_scratch_share,
    )
    app.state.metrics.transfers.set_function(lambda: app.state.transfers.in_progress)
    app.state.metrics.scratch_held.set_function(lambda: app.state.transfers.scratch_held)
    app.add_middleware(
        TransferGateMiddleware,
        slots=app.state.transfers,
        pace=TransferPace(settings.transfer_idle_timeout_s, settings.transfer_min_bytes_per_s),
    )
    app.add_middleware(
        BodySizeLimitMiddleware,
        max_bytes=settings.max_upload_bytes,
        message=f"request body exceeds this registry's {settings.max_upload_bytes}-byte "
        "limit; upload a smaller adapter or file",
    )
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    # Outermost: every answer carries x-request-id, every request gets one log line.
    app.add_middleware(AccessLogMiddleware, logger_name=ACCESS_LOGGER)
    for module in (tenants, keys, adapters, users, usage, audit, health):
        app.include_router(module.router)
    if settings.finetune.enabled:
        for module in (files, fine_tuning):
            app.include_router(module.router)
    return app
