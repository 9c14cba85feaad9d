"""A Redis outage's 503s are counted like every other failure (they were in no counter,
so the error-rate alert could not see an outage)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import MSGS, Workers, message
from tests.support.redis_process import RedisProcess
from tests.support.registry_writer import Writer


def _value(text: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_redis_outage_503s_are_counted(tmp_path: Path) -> None:
    server = RedisProcess(tmp_path).start()
    namespace = f"ro{uuid.uuid4().hex[:8]}"
    _, key = Writer(server.url, namespace).tenants.create("acme")
    settings = GatewaySettings(
        worker_urls=["http://w1:8000"],
        base_model_name="tiny",
        redis_url=server.url,
        namespace=namespace,
    )
    app = create_app(settings, transport=httpx.MockTransport(Workers()))
    auth = {"Authorization": f"Bearer {key.api_key}"}
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            # The key is looked up (and cached) while Redis is up.
            first = client.post(
                "/v1/chat/completions", headers=auth, json={"messages": MSGS, "user": "nobody"}
            )
            assert first.status_code == 404, first.text
            server.kill()
            # A binding nothing cached: past authentication, so counted per tenant too.
            lookup = client.post(
                "/v1/chat/completions",
                headers=auth,
                json={"messages": MSGS, "user": "someone-else"},
            )
            # A key nothing cached: refused before any tenant is known.
            unknown_key = client.post(
                "/v1/chat/completions",
                headers={"Authorization": "Bearer pft_unknown.key"},
                json={"messages": MSGS, "user": "x"},
            )
            text = client.get("/metrics").text
    finally:
        server.stop()
    for resp in (lookup, unknown_key):
        assert resp.status_code == 503, resp.text
        assert message(resp) == "the registry's Redis is unavailable; retry shortly"
    assert _value(text, 'preft_gateway_errors_total{cause="service_unavailable"}') == 2
    assert _value(text, 'preft_gateway_tenant_requests_total{status="503",tenant="acme"}') == 1
    assert _value(text, 'preft_gateway_requests_total{adapter="none",status="503"}') == 1
