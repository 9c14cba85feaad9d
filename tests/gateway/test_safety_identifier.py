"""``safety_identifier`` (the openai SDK's successor of ``user``) selects the user's adapter
like ``user`` does; the two at once must name the same user."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, KEY, MSGS, SHA, FakeRegistry, Workers, message
from tests.support.inprocess import serving

SETTINGS = GatewaySettings(
    worker_urls=["http://w1:8000"], base_model_name="tiny", worker_base_model="/models/tiny"
)


@pytest.fixture
def workers() -> Workers:
    return Workers()


@pytest.fixture
def client(workers: Workers) -> Iterator[TestClient]:
    app = create_app(SETTINGS, transport=httpx.MockTransport(workers), registry=FakeRegistry())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/chat/completions", {"messages": MSGS}), ("/v1/completions", {"prompt": "hi"})],
)
@pytest.mark.parametrize("model", [None, "tiny"])
def test_safety_identifier_runs_the_users_adapter(
    client: TestClient, workers: Workers, path: str, body: dict[str, object], model: str | None
) -> None:
    extra = {"model": model} if model else {}
    resp = client.post(path, json={**body, **extra, "safety_identifier": "u1"}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    assert workers.seen[-1]["model"] == f"sha256:{SHA}"
    assert resp.headers["x-preft-adapter"] == "bot"


def test_user_and_safety_identifier_must_agree(client: TestClient, workers: Workers) -> None:
    same = client.post(
        "/v1/chat/completions",
        json={"messages": MSGS, "user": "u1", "safety_identifier": "u1"},
        headers=AUTH,
    )
    assert same.status_code == 200 and workers.seen[-1]["model"] == f"sha256:{SHA}"
    differ = client.post(
        "/v1/chat/completions",
        json={"messages": MSGS, "user": "u1", "safety_identifier": "u2"},
        headers=AUTH,
    )
    assert differ.status_code == 400
    assert "'user' and 'safety_identifier' name different users" in message(differ)
    assert len(workers.seen) == 1


@pytest.mark.parametrize("value", [7, "x" * 257])
def test_safety_identifier_is_checked_like_user(client: TestClient, value: object) -> None:
    resp = client.post(
        "/v1/chat/completions", json={"messages": MSGS, "safety_identifier": value}, headers=AUTH
    )
    assert resp.status_code == 400 and "'safety_identifier'" in message(resp)


def test_unbound_safety_identifier_is_404_not_the_base_model(
    client: TestClient, workers: Workers
) -> None:
    resp = client.post(
        "/v1/chat/completions", json={"messages": MSGS, "safety_identifier": "u2"}, headers=AUTH
    )
    assert resp.status_code == 404 and "user u2 has no adapter binding" in message(resp)
    assert workers.seen == []


def test_openai_client_safety_identifier() -> None:
    workers = Workers()
    app = create_app(SETTINGS, transport=httpx.MockTransport(workers), registry=FakeRegistry())
    with serving(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=20)
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=MSGS, safety_identifier="u1"
        )  # type: ignore[arg-type]
    assert raw.parse().model == "bot"
    assert raw.headers["x-preft-adapter"] == "bot"
    assert workers.seen[-1]["model"] == f"sha256:{SHA}"
