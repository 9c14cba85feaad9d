"""The completion fast path answers exactly as the FastAPI routes it bypasses.

The same requests go to a gateway with ``CompletionFastPath`` (as deployed) and to one
without it (FastAPI's routes, the documented contract); status, error envelope, body and
the headers a client reads must match, and the fast path must really be the one serving."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from preft_serve.gateway.app import create_app
from preft_serve.gateway.fast_path import CompletionFastPath
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import AUTH, MSGS, FakeRegistry, Workers

CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
CASES: list[tuple[str, str, dict[str, str], Any]] = [
    ("POST", CHAT, AUTH, {"messages": MSGS, "user": "u1"}),
    ("POST", CHAT, AUTH, {"messages": MSGS, "user": "u1", "stream": True}),
    ("POST", TEXT, AUTH, {"prompt": "Once", "model": "bot", "max_tokens": 4}),
    ("POST", CHAT, {}, {"messages": MSGS, "user": "u1"}),  # no key: 401
    ("POST", CHAT, {"Authorization": "Basic x"}, {"messages": MSGS}),  # not bearer: 401
    ("POST", CHAT, {"Authorization": "Bearer nope"}, {"messages": MSGS}),  # wrong key: 401
    ("POST", CHAT, AUTH, {"messages": MSGS, "user": "nobody"}),  # unbound user: 404
    ("POST", CHAT, AUTH, {"messages": MSGS, "model": "rival"}),  # another tenant's: 404
    ("POST", CHAT, AUTH, {"messages": []}),  # invalid body: 400
    ("POST", CHAT, AUTH, b"{not json"),  # 400
    ("POST", CHAT, AUTH, b"x" * 5000),  # over the body limit: 413
    ("GET", CHAT, AUTH, None),  # not the fast path's: FastAPI's 405
]


def _client(fast: bool, workers: Workers) -> TestClient:
    settings = GatewaySettings(
        worker_urls=["http://w1:8000"], base_model_name="tiny", max_body_bytes=4096
    )
    app = create_app(settings, transport=httpx.MockTransport(workers), registry=FakeRegistry())
    if not fast:
        app.user_middleware = [m for m in app.user_middleware if m.cls is not CompletionFastPath]
    return TestClient(app, raise_server_exceptions=False)


def _send(
    client: TestClient, method: str, path: str, headers: dict[str, str], body: Any
) -> httpx.Response:
    if isinstance(body, bytes):
        return client.request(
            method, path, content=body, headers={**headers, "content-type": "application/json"}
        )
    return client.request(method, path, json=body, headers=headers)


def _shown(response: httpx.Response) -> tuple[int, str, str, dict[str, str]]:
    kept = {
        k: v
        for k, v in response.headers.items()
        if k not in ("x-request-id", "content-length", "date")
    }
    return response.status_code, response.headers.get("content-type", ""), response.text, kept


@pytest.fixture
def clients() -> Iterator[tuple[TestClient, TestClient, Workers, Workers]]:
    fast_workers, slow_workers = Workers(), Workers()
    with _client(True, fast_workers) as fast, _client(False, slow_workers) as slow:
        yield fast, slow, fast_workers, slow_workers


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]} {c[1]} {str(c[3])[:40]}")
def test_the_fast_path_answers_as_the_fastapi_route(
    clients: tuple[TestClient, TestClient, Workers, Workers],
    case: tuple[str, str, dict[str, str], Any],
) -> None:
    fast, slow, fast_workers, slow_workers = clients
    a, b = _send(fast, *case), _send(slow, *case)
    assert _shown(a) == _shown(b)
    assert a.headers["x-request-id"] and b.headers["x-request-id"]
    # Both forwarded the same bodies to the worker (none for refused requests).
    assert fast_workers.seen == slow_workers.seen


def test_the_fast_path_serves_completions_without_fastapis_router(
    clients: tuple[TestClient, TestClient, Workers, Workers],
) -> None:
    fast, slow, _, _ = clients
    for client in (fast, slow):  # take the completion routes out of FastAPI's router
        app = client.app
        assert isinstance(app, FastAPI)
        app.router.routes = [
            r for r in app.router.routes if getattr(r, "path", None) not in (CHAT, TEXT)
        ]
    body = {"messages": MSGS, "user": "u1"}
    assert fast.post(CHAT, json=body, headers=AUTH).status_code == 200
    assert slow.post(CHAT, json=body, headers=AUTH).status_code == 404
