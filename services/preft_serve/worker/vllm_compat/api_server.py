"""Seam 9, vLLM's API server (``vllm/entrypoints/launchers/api_server/entry.py``,
``vllm/entrypoints/launchers/app.py``): the worker's HTTP app without vLLM's control routes.

vLLM's server carries, next to the OpenAI API, routes that change what or how it serves and
take no key: runtime LoRA loading (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, which the load-by-hash
resolver needs on, also opens ``/v1/load_lora_adapter`` and SageMaker's ``/adapters``: anyone
who reached a worker could load other weights under a tenant's ``sha256:`` name), elastic
scaling, aborting others' requests, and with ``VLLM_SERVER_DEV_MODE``, a profiler config or
``--enable-fault-tolerance`` also RPCs into the workers, sleep, cache resets and weight
updates. No part of preft-serve calls any of them: adapters arrive through the resolver. So
``python -m preft_serve.worker.vllm_compat.api_server`` runs vLLM's own server
(``vllm.entrypoints.openai.api_server``'s ``main``) with :data:`CLOSED_ROUTES` removed from
its app, whatever flags turned them on; they answer 404 like any unknown path.

Relies on: ``entry.build_and_serve`` calling the module-level name ``build_app`` (patched
here in ``entry``'s namespace) once per API server process, and the route paths below.
Upgrading vLLM: list the new version's routes (``tests/worker/test_api_routes.py`` fails on
any route not reviewed here) and sort each into closed or open.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from starlette.routing import BaseRoute

RUNTIME_LORA = frozenset(
    {
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/adapters",
        "/adapters/{adapter_name}",  # SageMaker's names for the same two
    }
)
ENGINE_CONTROL = frozenset(
    {
        "/scale_elastic_ep",
        "/is_scaling_elastic_ep",
        "/inference/v1/abort_requests",
        "/start_profile",
        "/stop_profile",  # with a --profiler-config
        "/fault_tolerance/apply",
        "/fault_tolerance/status",  # with --enable-fault-tolerance
    }
)
DEV_MODE = frozenset(
    {  # VLLM_SERVER_DEV_MODE=1: vLLM's own "not for production" routes
        "/reset_prefix_cache",
        "/reset_mm_cache",
        "/reset_encoder_cache",
        "/collective_rpc",
        "/server_info",
        "/sleep",
        "/release_kv_cache_memory",
        "/wake_up",
        "/is_sleeping",
        "/pause",
        "/resume",
        "/abort_requests",
        "/is_paused",
        "/init_weight_transfer_engine",
        "/shutdown_weight_transfer_engine",
        "/start_weight_update",
        "/start_draft_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/update_weight_version",
        "/weight_info",
        "/weight_checker",
        "/get_world_size",
    }
)
CLOSED_ROUTES = RUNTIME_LORA | ENGINE_CONTROL | DEV_MODE

# Reviewed and left open: serving (what anyone reaching a worker can do anyway, and adapters
# only by name or content hash), read-only status, and the schema pages.
OPEN_ROUTES = frozenset(
    {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/chat/completions/batch",
        "/v1/responses",
        "/v1/responses/{response_id}",
        "/v1/responses/{response_id}/cancel",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/systemone",
        "/generative_scoring",
        "/inference/v1/generate",
        "/invocations",
        "/tokenize",
        "/detokenize",
        "/v1/chat/completions/render",
        "/v1/messages/render",
        "/v1/completions/render",
        "/v1/responses/render",
        "/v1/chat/completions/derender",
        "/v1/completions/derender",
        "/v1/models",
        "/health",
        "/ping",
        "/load",
        "/version",
        "/kv_event_sources",
        "/metrics",
        "/openapi.json",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
    }
)


def route_path(route: BaseRoute) -> str:
    return str(getattr(route, "path", ""))


def close_routes(app: FastAPI) -> FastAPI:
    """Remove :data:`CLOSED_ROUTES` from ``app`` (in place; returned for chaining)."""
    app.router.routes[:] = [r for r in app.router.routes if route_path(r) not in CLOSED_ROUTES]
    app.openapi_schema = None  # rebuilt without them on the next /openapi.json
    return app


def closing(build_app: Callable[..., FastAPI]) -> Callable[..., FastAPI]:
    """``build_app`` whose apps have :data:`CLOSED_ROUTES` removed."""

    @functools.wraps(build_app)
    def build(*args: Any, **kwargs: Any) -> FastAPI:
        return close_routes(build_app(*args, **kwargs))

    return build


def main() -> None:
    """vLLM's OpenAI server entry point, its apps built by :func:`closing`, its tokenizer
    routes bounded (:mod:`.tokenization`)."""
    from vllm.entrypoints.launchers.api_server import entry

    from preft_serve.worker.vllm_compat import tokenization

    tokenization.install()  # seam 10: the tokenizer routes within the model's context
    entry.build_app = closing(entry.build_app)
    entry.main()


if __name__ == "__main__":
    main()
