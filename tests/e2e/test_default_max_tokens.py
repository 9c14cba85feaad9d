"""Requests that send no ``max_tokens`` through a gateway whose cap is above the workers'
context: the gateway fills in a default that fits the context the workers report, so vLLM
serves them instead of refusing the request (a 1024-token model behind the default cap of
4096 is the one-box stack's case)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.stack import BASE_NAME, WORKER_MAX_MODEL_LEN, Base, Registry, running_gateway
from tests.support.processes import ServiceProcess

QUESTION = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def roomy_gateway(
    base: Base, redis_server: str, namespace: str, worker: ServiceProcess, registry: Registry
) -> Iterator[ServiceProcess]:
    """A gateway that would fill in twice the workers' context."""
    cap = str(2 * WORKER_MAX_MODEL_LEN)
    with running_gateway(
        Path(base.root),
        redis_server,
        namespace,
        base.model,
        [worker.url],
        name="roomy-gateway",
        extra_env={"PREFT_GATEWAY_MAX_TOKENS_CAP": cap, "PREFT_GATEWAY_MAX_REQUEST_TOKENS": cap},
    ) as process:
        yield process


@pytest.mark.parametrize("route", ["chat", "responses"])
def test_a_request_without_max_tokens_fits_the_workers_context(
    roomy_gateway: ServiceProcess, registry: Registry, worker: ServiceProcess, route: str
) -> None:
    models = httpx.get(f"{worker.url}/v1/models", timeout=30).json()["data"]
    # The base model's entry: adapters other tests of the shared stack loaded list none.
    base = [m for m in models if m.get("parent") is None]
    assert [m.get("max_model_len") for m in base] == [WORKER_MAX_MODEL_LEN], json.dumps(models)
    key = registry.create_tenant(f"ctx-{route}")
    path, body = {
        "chat": ("/v1/chat/completions", {"messages": QUESTION}),
        "responses": ("/v1/responses", {"input": QUESTION}),
    }[route]
    reply = httpx.post(
        f"{roomy_gateway.url}{path}",
        timeout=300,
        json={"model": BASE_NAME, "temperature": 0, **body},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    output = usage.get("completion_tokens", usage.get("output_tokens"))
    assert output > 0 and prompt + output <= WORKER_MAX_MODEL_LEN, usage
