"""Request ids (``x-request-id``) and the gateway's access log.

The id is the client's ``X-Request-Id`` when it is sane, else a fresh uuid4 hex; it goes to
the worker, comes back on every answer (errors and streams too) and is in the access log
line, which also names the tenant, adapter, user and token counts, and never a key or a
prompt. The openai client reads the header as ``_request_id`` / ``error.request_id``.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from preft_serve.common.logging import setup_logging
from preft_serve.gateway.app import ACCESS_LOGGER, create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, KEY, MSGS, FakeRegistry, Workers
from tests.support.inprocess import serving

HEX_ID = re.compile(r"[0-9a-f]{32}")
PROMPT = "hello"  # what MSGS says; must never reach a log line


def settings() -> GatewaySettings:
    return GatewaySettings(
        worker_urls=["http://w1:8000"],
        base_model_name="tiny",
        worker_base_model="/models/tiny",
        max_body_bytes=4096,
    )


@pytest.fixture
def workers() -> Workers:
    return Workers()


@pytest.fixture
def client(workers: Workers) -> Iterator[TestClient]:
    app = create_app(settings(), transport=httpx.MockTransport(workers), registry=FakeRegistry())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def access(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Captures the access log (a line is written when its request has finished)."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    return caplog


def access_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == ACCESS_LOGGER]


# -- the openai client against a served gateway -----------------------------------------


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Workers]]:
    workers = Workers()
    app = create_app(settings(), transport=httpx.MockTransport(workers), registry=FakeRegistry())
    with serving(app) as url:
        yield url, workers


def openai_client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=20)


def test_openai_client_sees_its_own_id_and_the_worker_gets_it(served: tuple[str, Workers]) -> None:
    url, workers = served
    reply = openai_client(url).chat.completions.create(
        model="bot", messages=MSGS, extra_headers={"X-Request-Id": "trace-42 a/b"}
    )  # type: ignore[arg-type]
    assert reply._request_id == "trace-42 a/b"
    assert workers.headers[-1]["x-request-id"] == "trace-42 a/b"


def test_openai_client_gets_a_fresh_id_when_it_sends_none(served: tuple[str, Workers]) -> None:
    url, workers = served
    reply = openai_client(url).chat.completions.create(model="bot", messages=MSGS)  # type: ignore[arg-type]
    assert reply._request_id is not None and HEX_ID.fullmatch(reply._request_id)
    assert workers.headers[-1]["x-request-id"] == reply._request_id


def test_openai_stream_and_errors_carry_the_id(served: tuple[str, Workers]) -> None:
    url, workers = served
    with openai_client(url).chat.completions.create(
        model="bot",
        messages=MSGS,
        stream=True,  # type: ignore[arg-type]
        extra_headers={"X-Request-Id": "stream-1"},
    ) as stream:
        assert stream.response.headers["x-request-id"] == "stream-1"
        assert [c.model for c in stream] == ["bot", "bot"]
    assert workers.headers[-1]["x-request-id"] == "stream-1"

    with pytest.raises(openai.NotFoundError) as unbound:
        openai_client(url).chat.completions.create(
            messages=MSGS,
            user="nobody",  # type: ignore[call-overload]
            model=openai.NOT_GIVEN,
        )
    assert unbound.value.request_id is not None and HEX_ID.fullmatch(unbound.value.request_id)
    with pytest.raises(openai.AuthenticationError) as denied:
        openai_client(url, key="pft_wrong").chat.completions.create(
            model="bot", messages=MSGS, extra_headers={"X-Request-Id": "denied-1"}
        )  # type: ignore[arg-type]
    assert denied.value.request_id == "denied-1"


# -- ids: what is accepted, what is replaced ---------------------------------------------


@pytest.mark.parametrize("sent", ["x" * 128, "a b", 'req:1/2;q="x"~'])
def test_sane_ids_are_kept(client: TestClient, workers: Workers, sent: str) -> None:
    resp = client.post(
        "/v1/chat/completions",
        json={"messages": MSGS, "user": "u1"},
        headers={**AUTH, "X-Request-Id": sent},
    )
    assert resp.status_code == 200
    assert resp.headers["x-request-id"] == workers.headers[-1]["x-request-id"] == sent


@pytest.mark.parametrize("sent", ["x" * 129, "caf\u00e9", "tab\there", "nul\x00", "", " padded "])
def test_bad_ids_are_replaced(client: TestClient, workers: Workers, sent: str) -> None:
    resp = client.post(
        "/v1/chat/completions",
        json={"messages": MSGS, "user": "u1"},
        headers=[*AUTH.items(), ("X-Request-Id", sent.encode("latin-1"))],
    )
    assert resp.status_code == 200
    new = resp.headers["x-request-id"]
    assert HEX_ID.fullmatch(new) and new != sent
    assert workers.headers[-1]["x-request-id"] == new


def test_every_error_answer_has_an_id(client: TestClient) -> None:
    answers = {
        401: client.post("/v1/chat/completions", json={"messages": MSGS}),
        400: client.post("/v1/chat/completions", json={"messages": []}, headers=AUTH),
        404: client.get("/v1/nowhere", headers=AUTH),
        413: client.post(
            "/v1/completions",
            content=b"x" * 5000,
            headers={**AUTH, "Content-Type": "application/json"},
        ),
    }
    for status, resp in answers.items():
        assert resp.status_code == status, resp.text
        assert HEX_ID.fullmatch(resp.headers["x-request-id"]), status
    kept = client.post(
        "/v1/chat/completions", json={"messages": MSGS}, headers={"X-Request-Id": "no-key-7"}
    )
    assert kept.status_code == 401 and kept.headers["x-request-id"] == "no-key-7"


class BrokenRegistry(FakeRegistry):
    async def resolve_user(self, tenant: str, user: str) -> Any:
        raise RuntimeError("bug")


def test_an_unexpected_500_has_the_id_and_its_log_line(access: pytest.LogCaptureFixture) -> None:
    app = create_app(
        settings(), transport=httpx.MockTransport(Workers()), registry=BrokenRegistry()
    )
    with TestClient(app, raise_server_exceptions=False) as c:
        resp = c.post(
            "/v1/chat/completions",
            json={"messages": MSGS, "user": "u1"},
            headers={**AUTH, "X-Request-Id": "boom-1"},
        )
    assert resp.status_code == 500 and resp.headers["x-request-id"] == "boom-1"
    [line] = access_records(access)
    assert (line.request_id, line.status, line.tenant) == ("boom-1", 500, "acme")  # type: ignore[attr-defined]


# -- the access log ------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_access_line_names_tenant_adapter_user_and_tokens(
    client: TestClient, access: pytest.LogCaptureFixture, stream: bool
) -> None:
    resp = client.post(
        "/v1/chat/completions",
        json={"messages": MSGS, "user": "u1", "stream": stream},
        headers={**AUTH, "X-Request-Id": "log-1"},
    )
    assert resp.status_code == 200
    [line] = access_records(access)
    fields = vars(line)
    assert {
        k: fields[k]
        for k in (
            "request_id",
            "tenant",
            "adapter",
            "adapter_version",
            "model",
            "user",
            "status",
            "prompt_tokens",
            "completion_tokens",
            "route",
            "method",
            "worker",
        )
    } == {
        "request_id": "log-1",
        "tenant": "acme",
        "adapter": "bot",
        "adapter_version": 1,
        "model": "bot",
        "user": "u1",
        "status": 200,
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "route": "/v1/chat/completions",
        "method": "POST",
        "worker": "http://w1:8000",
    }
    assert isinstance(fields["latency_ms"], float) and fields["latency_ms"] >= 0
    assert line.getMessage().startswith("POST /v1/chat/completions 200 ")


def test_access_line_of_the_base_model_and_of_refusals(
    client: TestClient, access: pytest.LogCaptureFixture
) -> None:
    client.post("/v1/completions", json={"prompt": PROMPT, "model": "tiny"}, headers=AUTH)
    client.post(
        "/v1/completions",
        json={"prompt": PROMPT, "model": "tiny"},
        headers={"Authorization": "Bearer pft_wrong.s3cr3t"},
    )
    base, refused = access_records(access)
    assert (base.status, base.model, base.adapter, base.tenant) == (  # type: ignore[attr-defined]
        200,
        "tiny",
        None,
        "acme",
    )
    assert refused.status == 401 and not hasattr(refused, "tenant")  # type: ignore[attr-defined]


def test_access_lines_carry_no_keys_or_prompts(client: TestClient) -> None:
    """The JSON lines an operator ships: counts stay numbers, secrets and prompts absent."""
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = setup_logging("INFO", json_output=True, stream=stream)
    try:
        client.post(
            "/v1/chat/completions",
            json={"messages": MSGS, "user": "u1"},
            headers={**AUTH, "X-Request-Id": "json-1"},
        )
        client.post(
            "/v1/chat/completions",
            json={"messages": MSGS, "user": "u1"},
            headers={"Authorization": "Bearer pft_abc.topsecretvalue"},
        )
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    out = stream.getvalue()
    lines = [json.loads(x) for x in out.splitlines()]
    ok = next(e for e in lines if e.get("request_id") == "json-1")
    assert ok["logger"] == ACCESS_LOGGER
    assert (ok["prompt_tokens"], ok["completion_tokens"], ok["tenant"]) == (5, 3, "acme")
    for secret in (KEY, "topsecretvalue", "pft_abc", PROMPT, "Bearer"):
        assert secret not in out
