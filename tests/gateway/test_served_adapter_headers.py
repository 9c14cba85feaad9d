"""Every answer says which adapter version served it (``x-preft-adapter*`` headers), so a
client can tell whether a hot swap has reached its request (the soak test checks this)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, MSGS, SHA, FakeRegistry, Workers

HEADERS = ("x-preft-adapter", "x-preft-adapter-version", "x-preft-adapter-sha256")


@pytest.fixture
def client() -> Iterator[TestClient]:
    settings = GatewaySettings(worker_urls=["http://w1:8000"], base_model_name="tiny",
                               worker_base_model="/models/tiny")
    app = create_app(settings, transport=httpx.MockTransport(Workers()),
                     registry=FakeRegistry())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_adapter_answers_name_version_and_hash(client: TestClient, stream: bool,
                                               path: str) -> None:
    body = {"messages": MSGS} if "chat" in path else {"prompt": "hi"}
    resp = client.post(path, json={**body, "user": "u1", "stream": stream}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    assert [resp.headers[h] for h in HEADERS] == ["bot", "1", SHA]


def test_base_model_and_errors_name_no_adapter(client: TestClient) -> None:
    base = client.post("/v1/chat/completions", json={"messages": MSGS, "model": "tiny"},
                       headers=AUTH)
    assert base.status_code == 200
    unbound = client.post("/v1/chat/completions", json={"messages": MSGS, "user": "u2"},
                          headers=AUTH)
    assert unbound.status_code == 404
    for resp in (base, unbound):
        assert not any(h in resp.headers for h in HEADERS)
