"""A request is counted once, as it ended: a worker's whole answer that breaks off is the
client's 502 in ``requests_total`` too (not the 200 its headers said), with its cause, no
latency of an answered request and no usage billed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, MSGS, FakeRegistry


class BreaksOff(httpx.AsyncByteStream):
    """A whole (not streamed) answer whose connection drops after its first bytes."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'{"model": "sha256:'
        raise httpx.ReadError("connection reset by peer")


def worker(request: httpx.Request) -> httpx.Response:
    if request.method == "GET":
        return httpx.Response(200, json={"object": "list", "data": []})
    return httpx.Response(200, stream=BreaksOff(), headers={"content-type": "application/json"})


def _series(text: str, name: str) -> dict[str, float]:
    return {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith(name + "{")
    }


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": MSGS}),
        ("/v1/completions", {"prompt": "hello"}),
        ("/v1/responses", {"input": "hello"}),
    ],
)
def test_an_answer_that_breaks_off_is_counted_as_the_clients_502(
    path: str, body: dict[str, Any]
) -> None:
    app = create_app(
        GatewaySettings(
            worker_urls=["http://w1:8000"], base_model_name="tiny", worker_base_model="/models/tiny"
        ),
        transport=httpx.MockTransport(worker),
        registry=FakeRegistry(),
    )
    with TestClient(app, raise_server_exceptions=False) as client:
        resp = client.post(path, json={**body, "user": "u1"}, headers=AUTH)
        assert resp.status_code == 502, resp.text
        assert resp.json()["error"]["code"] == "bad_gateway"
        text = client.get("/metrics").text
    assert _series(text, "preft_gateway_requests_total") == {
        'preft_gateway_requests_total{adapter="bot",status="502"}': 1.0
    }
    assert _series(text, "preft_gateway_tenant_requests_total") == {
        'preft_gateway_tenant_requests_total{status="502",tenant="acme"}': 1.0
    }
    assert _series(text, "preft_gateway_errors_total") == {
        'preft_gateway_errors_total{cause="bad_gateway"}': 1.0
    }
    assert 'preft_gateway_request_seconds_count{adapter="bot"}' not in text
    assert "preft_gateway_prompt_tokens_total{" not in text
    assert 'preft_gateway_routing_total{result="preferred"} 1.0' in text
