"""``/tokenize``, ``/detokenize`` and ``/version`` behind the gateway: the tenant's key and
``model`` are checked as for a completion, the worker tokenizes with its base model (the
tokenizer every adapter shares), and its answers and errors come back in the gateway's
envelope. A real worker's answers: tests/gateway/test_e2e.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, FakeRegistry

WORKER = "http://w0:8000"


class Tokenizer:
    """A worker's tokenizer routes: ids are the prompt's character codes."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            if request.url.path == "/version":
                return httpx.Response(200, json={"version": "0.32.0"})
            return httpx.Response(200, json={"object": "list", "data": []})
        body = json.loads(request.content)
        self.seen.append((request.url.path, body))
        if request.url.path == "/tokenize":
            ids = [ord(c) for c in body["prompt"]]
            return httpx.Response(200, json={"tokens": ids, "count": len(ids),
                                             "max_model_len": 256})
        if any(t > 0x10FFFF for t in body["tokens"]):
            return httpx.Response(400, json={"error": {
                "message": "token id out of range", "type": "BadRequestError",
                "param": None, "code": 400}})
        return httpx.Response(200, json={"prompt": "".join(map(chr, body["tokens"]))})


@pytest.fixture
def worker() -> Tokenizer:
    return Tokenizer()


@pytest.fixture
def client(worker: Tokenizer) -> Iterator[TestClient]:
    settings = GatewaySettings(worker_urls=[WORKER], base_model_name="tiny",
                               worker_base_model="/models/tiny")
    app = create_app(settings, transport=httpx.MockTransport(worker), registry=FakeRegistry())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("model", ["bot", "tiny", None])
def test_tokenize_runs_the_base_models_tokenizer(client: TestClient, worker: Tokenizer,
                                                 model: str | None) -> None:
    body = {"prompt": "hi"} | ({"model": model} if model else {})
    reply = client.post("/tokenize", headers=AUTH, json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["tokens"] == [104, 105]
    path, sent = worker.seen[-1]
    assert path == "/tokenize" and sent == {"prompt": "hi", "model": "/models/tiny"}


def test_detokenize_round_trips_and_relays_worker_errors(client: TestClient,
                                                         worker: Tokenizer) -> None:
    reply = client.post("/detokenize", headers=AUTH, json={"model": "bot", "tokens": [104, 105]})
    assert reply.status_code == 200 and reply.json() == {"prompt": "hi"}
    bad = client.post("/detokenize", headers=AUTH, json={"tokens": [2 ** 40]})
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert (error["message"], error["type"], error["code"]) == (
        "token id out of range", "invalid_request_error", "invalid_value")


@pytest.mark.parametrize("model", ["rival", "nope"])  # another tenant's, and no one's
def test_an_adapter_the_tenant_lacks_is_a_404_and_reaches_no_worker(
        client: TestClient, worker: Tokenizer, model: str) -> None:
    reply = client.post("/tokenize", headers=AUTH, json={"model": model, "prompt": "hi"})
    assert reply.status_code == 404
    assert reply.json()["error"]["message"] == (
        f"model '{model}' does not exist; GET /v1/models lists yours")
    assert worker.seen == []


def test_without_a_key_or_with_a_foreign_adapter_field_nothing_is_sent(
        client: TestClient, worker: Tokenizer) -> None:
    assert client.post("/tokenize", json={"prompt": "hi"}).status_code == 401
    assert client.get("/version").status_code == 401
    refused = client.post("/tokenize", headers=AUTH, json={"prompt": "hi", "lora_name": "x"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "lora_name"
    not_object = client.post("/tokenize", headers=AUTH, content=b"[1, 2]")
    assert not_object.status_code == 400
    assert worker.seen == []


def test_version_is_the_workers(client: TestClient) -> None:
    reply = client.get("/version", headers=AUTH)
    assert reply.status_code == 200 and reply.json() == {"version": "0.32.0"}
