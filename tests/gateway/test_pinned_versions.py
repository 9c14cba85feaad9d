"""``name@version`` of a version that does not exist: the 404 names the versions that do,
staged ones above the served version included, and the version the name alone serves.
Versions are written by the registry's own service code on a real Redis."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.common.key_roles import KeyRole
from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.registry.api_keys import KeySpec
from preft_serve.registry.validation import ValidatedAdapter
from tests.support.gateway import MSGS, Workers
from tests.support.registry_writer import Writer


class Stack:
    def __init__(self, client: TestClient, writer: Writer, workers: Workers) -> None:
        self.client = client
        self.writer = writer
        self.workers = workers
        made = writer.tenants.create_key("acme", KeySpec(KeyRole.INFERENCE, None, None))
        self.headers = {"Authorization": f"Bearer {made.api_key}"}

    def version(self, name: str, content: str, *, promote: bool) -> None:
        """Store a new version of ``name``: served to everyone, or staged."""
        v = ValidatedAdapter(
            config={"peft_type": "LORA"},
            config_bytes=b'{"peft_type":"LORA"}',
            weights_path=Path("/dev/null"),
            type=AdapterType.LORA,
            mode=AdapterMode.PREFILL,
            rank=8,
            sha256=hashlib.sha256(content.encode()).hexdigest(),
            size_bytes=10,
            base_model="tiny",
        )
        self.writer.adapters.commit("acme", name, v, create=False, promote=promote, stored_at=None)

    def missing(self, model: str) -> str:
        """The 404 message for ``model`` from both routes that name it; they agree."""
        seen = len(self.workers.seen)
        chat = self.client.post(
            "/v1/chat/completions", json={"model": model, "messages": MSGS}, headers=self.headers
        )
        got = self.client.get(f"/v1/models/{model}", headers=self.headers)
        assert (chat.status_code, got.status_code) == (404, 404), (chat.text, got.text)
        assert chat.json()["error"] == got.json()["error"]
        assert chat.json()["error"]["code"] == "model_not_found"
        assert chat.json()["error"]["param"] == "model"
        assert len(self.workers.seen) == seen  # nothing reached a worker
        return str(chat.json()["error"]["message"])


@pytest.fixture
def stack(redis_server: str) -> Iterator[Stack]:
    namespace = f"pv{uuid.uuid4().hex[:8]}"
    writer = Writer(redis_server, namespace)
    writer.tenants.create("acme")
    settings = GatewaySettings(
        worker_urls=["http://w1:8000"],
        base_model_name="tiny",
        redis_url=redis_server,
        namespace=namespace,
    )
    workers = Workers()
    app = create_app(settings, transport=httpx.MockTransport(workers))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield Stack(client, writer, workers)
    for key in writer.redis.scan_iter(f"{namespace}:*"):
        writer.redis.delete(key)


def _message(name: str, wanted: int, last: int, served: int) -> str:
    return (
        f"adapter '{name}' has no version {wanted}; its versions are 1 to {last} "
        f"('{name}' alone is version {served})"
    )


def test_staged_versions_above_the_served_one_are_named(stack: Stack) -> None:
    stack.version("bot", "v1", promote=True)
    stack.version("bot", "v2", promote=True)
    assert stack.missing("bot@3") == _message("bot", 3, 2, 2)
    stack.version("bot", "v3", promote=False)
    stack.version("bot", "v4", promote=False)
    # The staged versions exist (pinnable) and the name alone still serves version 2.
    for version in (3, 4):
        got = stack.client.get(f"/v1/models/bot@{version}", headers=stack.headers)
        assert got.json()["id"] == f"bot@{version}"
    assert stack.missing("bot@5") == _message("bot", 5, 4, 2)
    assert stack.missing("bot@999999999") == _message("bot", 999999999, 4, 2)


@pytest.mark.parametrize("staged", [1, 2, 3, 5, 8, 13])
def test_the_range_is_right_for_any_number_staged(stack: Stack, staged: int) -> None:
    stack.version("bot", "served", promote=True)
    for i in range(staged):
        stack.version("bot", f"staged-{i}", promote=False)
    last = 1 + staged  # written out: one served, then ``staged`` more
    assert stack.missing(f"bot@{last + 1}") == _message("bot", last + 1, last, 1)
    assert stack.missing(f"bot@{last + 7}") == _message("bot", last + 7, last, 1)
    assert stack.missing("bot@123456789") == _message("bot", 123456789, last, 1)
