"""The gateway forwards /v1/files, /v1/fine_tuning/jobs and /v1/audit to the registry; when
it has no registry, or the registry does not answer, the client gets OpenAI's error envelope
with what to do. (The whole flow against a real registry: tests/finetune/test_through_gateway.py;
the audit log: test_audit_forwarding.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, FakeRegistry, Workers
from tests.support.ports import free_port

CALLS = [
    ("POST", "/v1/files"),
    ("GET", "/v1/files"),
    ("GET", "/v1/files/file-1"),
    ("GET", "/v1/files/file-1/content"),
    ("DELETE", "/v1/files/file-1"),
    ("POST", "/v1/fine_tuning/jobs"),
    ("GET", "/v1/fine_tuning/jobs?limit=2"),
    ("GET", "/v1/fine_tuning/jobs/ftjob-1"),
    ("POST", "/v1/fine_tuning/jobs/ftjob-1/cancel"),
    ("GET", "/v1/fine_tuning/jobs/ftjob-1/events"),
    ("GET", "/v1/fine_tuning/jobs/ftjob-1/checkpoints"),
    ("GET", "/v1/audit?limit=2"),
]


def _client(**settings: object) -> Iterator[TestClient]:
    app = create_app(
        GatewaySettings(worker_urls=["http://w1:8000"], **settings),  # type: ignore[arg-type]
        transport=httpx.MockTransport(Workers()),
        registry=FakeRegistry(),
    )
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def unconfigured() -> Iterator[TestClient]:
    yield from _client()


@pytest.fixture
def registry_down() -> Iterator[TestClient]:
    yield from _client(registry_url=f"http://127.0.0.1:{free_port()}", connect_timeout_s=2)


def _send(client: TestClient, method: str, path: str) -> httpx.Response:
    body = (
        {"files": {"file": ("a.jsonl", b"{}\n")}, "data": {"purpose": "fine-tune"}}
        if path == "/v1/files" and method == "POST"
        else {}
    )
    if path == "/v1/fine_tuning/jobs" and method == "POST":
        body = {"json": {"model": "base", "training_file": "file-1"}}
    return client.request(method, path, headers={**AUTH, "X-Request-Id": "trace-7"}, **body)


@pytest.mark.parametrize(("method", "path"), CALLS)
def test_without_a_registry_the_routes_say_they_are_not_enabled(
    unconfigured: TestClient, method: str, path: str
) -> None:
    resp = _send(unconfigured, method, path)
    assert resp.status_code == 501, resp.text
    error = resp.json()["error"]
    assert error["code"] == "registry_not_configured" and error["type"] == "server_error"
    assert "not enabled on this deployment" in error["message"]
    assert "PREFT_" not in error["message"]
    assert resp.headers["x-request-id"] == "trace-7"


@pytest.mark.parametrize(("method", "path"), CALLS)
def test_a_registry_that_does_not_answer_is_a_503_saying_to_retry(
    registry_down: TestClient, method: str, path: str
) -> None:
    resp = _send(registry_down, method, path)
    assert resp.status_code == 503, resp.text
    error = resp.json()["error"]
    assert error["code"] == "registry_unavailable" and error["type"] == "server_error"
    assert "registry" in error["message"] and "unreachable; try again later" in error["message"]
    assert "PREFT_" not in error["message"]
    assert resp.headers["x-request-id"] == "trace-7"
    metrics = registry_down.get("/metrics").text
    assert 'preft_gateway_errors_total{cause="registry_unavailable"}' in metrics


@pytest.mark.parametrize("fixture", ["unconfigured", "registry_down"])
@pytest.mark.parametrize(("method", "path"), CALLS)
def test_the_key_is_checked_first_whatever_the_registrys_state(
    request: pytest.FixtureRequest, fixture: str, method: str, path: str
) -> None:
    """As on the chat routes: no key is missing_api_key, a wrong one invalid_api_key, before
    anything is said of the registry (not configured, or down)."""
    client: TestClient = request.getfixturevalue(fixture)
    keyless = client.request(method, path)
    assert keyless.status_code == 401, keyless.text
    assert keyless.json()["error"]["code"] == "missing_api_key"
    assert "Authorization: Bearer" in keyless.json()["error"]["message"]
    wrong = client.request(method, path, headers={"Authorization": "Bearer pft_nope"})
    assert wrong.status_code == 401, wrong.text
    assert wrong.json()["error"]["code"] == "invalid_api_key"


def test_no_error_reply_names_a_server_setting() -> None:
    """Limits are stated by their values; the settings behind them are the operator's
    business (they are in the gateway's log), never in a reply to a client."""
    replies: list[httpx.Response] = []
    for settings in ({}, {"registry_url": f"http://127.0.0.1:{free_port()}"}):
        for client in _client(max_body_bytes=2048, max_upload_bytes=4096, **settings):
            for method, path in CALLS:
                replies.append(_send(client, method, path))
                replies.append(client.request(method, path))
            replies.append(client.post("/v1/files", headers=AUTH, content=b"x" * 8192))
            replies.append(
                client.post(
                    "/v1/fine_tuning/jobs", headers=AUTH, json={"model": "base", "pad": "x" * 4096}
                )
            )
            replies.append(
                client.post(
                    "/v1/chat/completions", headers=AUTH, json={"model": "bot", "pad": "x" * 4096}
                )
            )
            replies.append(client.delete("/v1/models/bot", headers=AUTH))
    statuses = {reply.status_code for reply in replies}
    assert {401, 413, 501, 503} <= statuses
    for reply in replies:
        assert reply.status_code >= 400 and reply.json()["error"]["message"], reply.text
        assert "PREFT_" not in reply.text, reply.text
    too_large = [r.json()["error"]["message"] for r in replies if r.status_code == 413]
    assert any("4096-byte limit" in m for m in too_large)  # the value, to fit under
    assert any("2048-byte limit" in m for m in too_large)


def test_registry_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="must start with http"):
        GatewaySettings(worker_urls=["http://w1:8000"], registry_url="registry:8081")
    assert (
        GatewaySettings(worker_urls=["http://w1:8000"], registry_url="http://r:8081/").registry_url
        == "http://r:8081"
    )


def test_the_forwarded_routes_are_in_the_gateways_document(unconfigured: TestClient) -> None:
    spec = unconfigured.get("/openapi.json").json()
    for method, path in CALLS:
        route = path.split("?")[0].replace("file-1", "{file_id}").replace("ftjob-1", "{job_id}")
        operation = spec["paths"][route][method.lower()]
        assert operation["security"] == [{"TenantApiKey": []}], route
        assert {"401", "501", "503"} <= set(operation["responses"]), route
    upload = spec["paths"]["/v1/files"]["post"]["requestBody"]["content"]
    assert upload["multipart/form-data"]["schema"]["required"] == ["file", "purpose"]
    create = spec["paths"]["/v1/fine_tuning/jobs"]["post"]["requestBody"]["content"]
    ref = create["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert {"model", "training_file"} <= set(spec["components"]["schemas"][ref]["properties"])
