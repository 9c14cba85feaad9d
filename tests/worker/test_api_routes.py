"""The worker's HTTP app: vLLM's server with every flag that adds control routes turned on,
less the routes :mod:`preft_serve.worker.vllm_compat.api_server` closes.

Built in-process from vLLM's own ``build_app`` (no engine); the real worker's refusals are in
``tests/worker/test_resolver.py``.
"""

from __future__ import annotations

import argparse
import json

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from vllm import envs
from vllm.entrypoints.launchers import app as vllm_app
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

from preft_serve.worker import serve
from preft_serve.worker.vllm_compat import api_server

# What anyone reaching a worker must not do: load or drop adapters, call into the model's
# processes, reset caches, sleep, pause, update weights, rescale, abort others' requests.
DANGEROUS = (
    ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/unload_lora_adapter"),
    ("POST", "/adapters"),
    ("DELETE", "/adapters/sha256:" + "ab" * 32),
    ("POST", "/collective_rpc"),
    ("POST", "/reset_prefix_cache"),
    ("POST", "/sleep"),
    ("POST", "/wake_up"),
    ("POST", "/pause"),
    ("POST", "/update_weights"),
    ("POST", "/init_weight_transfer_engine"),
    ("POST", "/scale_elastic_ep"),
    ("POST", "/inference/v1/abort_requests"),
    ("POST", "/abort_requests"),
    ("POST", "/start_profile"),
    ("POST", "/fault_tolerance/apply"),
    ("GET", "/server_info"),
)
SERVING = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/models",
    "/tokenize",
    "/detokenize",
    "/version",
    "/health",
    "/metrics",
)


def paths(app: FastAPI) -> set[str]:
    return {str(getattr(route, "path", "")) for route in app.router.routes}


@pytest.fixture
def every_flag(monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """vLLM's server arguments with all its optional route groups on."""
    envs.disable_envs_cache()  # an in-process engine elsewhere may have frozen vLLM's env
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    profiler = {"profiler": "torch", "torch_profiler_dir": "/nonexistent"}
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        ["--model", "m", "--profiler-config", json.dumps(profiler)]
    )
    args.enable_fault_tolerance = True
    return args


def test_vllm_opens_the_control_routes_this_closes(every_flag: argparse.Namespace) -> None:
    """Guards the test below from passing vacuously: stock vLLM serves all of them."""
    stock = paths(vllm_app.build_app(every_flag, ("generate",)))
    assert {path for _, path in DANGEROUS if not path.startswith("/adapters/")} <= stock
    assert "/adapters/{adapter_name}" in stock


def test_worker_app_refuses_control_routes_and_serves_the_api(
    every_flag: argparse.Namespace,
) -> None:
    app = api_server.closing(vllm_app.build_app)(every_flag, ("generate",))
    left = paths(app)
    assert not left & api_server.CLOSED_ROUTES
    assert set(SERVING) <= left
    client = TestClient(app, raise_server_exceptions=False)
    for method, path in DANGEROUS:
        reply = client.request(method, path, json={"lora_name": "x", "lora_path": "/tmp"})
        assert reply.status_code == 404, (method, path, reply.text)
        assert reply.json() == {"detail": "Not Found"}, (method, path)
    assert "/v1/load_lora_adapter" not in client.get("/openapi.json").text


def test_every_vllm_route_is_reviewed(every_flag: argparse.Namespace) -> None:
    """A vLLM upgrade that adds a route fails here until it is sorted into closed or open
    (``api_server.OPEN_ROUTES``, documented in docs/deploy.md)."""
    stock = paths(vllm_app.build_app(every_flag, ("generate",)))
    unreviewed = stock - api_server.CLOSED_ROUTES - api_server.OPEN_ROUTES
    assert not unreviewed


def test_launcher_execs_the_closing_server() -> None:
    assert api_server.__name__ == serve.VLLM_SERVER
