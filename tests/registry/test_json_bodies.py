"""JSON request bodies (tenants, limits, bindings) are bounded before they are parsed: a
nesting bomb (100k ``[``) was a 500 with a RecursionError in the log, now a 400 that says
the limit; an oversized body is a 413. Brackets inside strings do not count. Nothing in
Redis or the bucket changes."""

from __future__ import annotations

import pytest

from tests.support.registry_api import admin, error_message

BOMB = b"[" * 100_000
ROUTES = {
    "create tenant": ("post", "/v1/tenants", True),
    "tenant limits": ("put", "/v1/tenants/acme/limits", True),
    "bind user": ("put", "/v1/users/u1", False),
}


def _send(client, acme, route: str, body: bytes, content_type: str | None):
    method, path, is_admin = ROUTES[route]
    headers = dict(admin() if is_admin else acme)
    if content_type is not None:  # as bytes: httpx encodes str header values as ASCII
        headers["Content-Type"] = content_type.encode("latin-1")
    return client.request(method.upper(), path, content=body, headers=headers)


@pytest.mark.parametrize("content_type", ["application/json", None, "application/merge-patch+json"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_nesting_bomb_refused_before_parsing(
    route, content_type, client, acme, state_snapshot, caplog
):
    before = state_snapshot()
    resp = _send(client, acme, route, BOMB, content_type)
    assert resp.status_code == 400, resp.text
    assert error_message(resp) == (
        "request body nests JSON arrays/objects 100000 levels deep; the limit is 32"
    )
    assert "Traceback" not in caplog.text and "RecursionError" not in caplog.text
    assert state_snapshot() == before


# Content types that FastAPI still parses as JSON although a byte-wise check would not
# (it strips NBSP and other separators around the media type), and others that are no
# JSON at all: none may carry a large body past the guard.
OTHER_CONTENT_TYPES = [
    "application/json\xa0",
    "\xa0application/json",
    "\x1capplication/json",
    "text/plain",
    "application/octet-stream",
    "multipart/mixed",
    # A form is an upload only on the upload routes: elsewhere it was read whole first.
    "multipart/form-data; boundary=zz",
]


@pytest.mark.parametrize("content_type", ["application/json", *OTHER_CONTENT_TYPES])
@pytest.mark.parametrize("route", list(ROUTES))
def test_oversized_body_refused_whatever_its_content_type(
    route, content_type, client, acme, state_snapshot
):
    before = state_snapshot()
    body = b'{"name": "' + b"a" * (1 << 20) + b'"}'
    resp = _send(client, acme, route, body, content_type)
    assert resp.status_code == 413, resp.text
    assert error_message(resp) == (
        "request body is larger than 1048576 bytes; the registry's JSON bodies are a few "
        "small fields (adapters are uploaded as multipart/form-data)"
    )
    assert state_snapshot() == before


@pytest.mark.parametrize("content_type", OTHER_CONTENT_TYPES[:3])
def test_nesting_bomb_behind_an_odd_content_type_refused(
    content_type, client, acme, state_snapshot, caplog
):
    before = state_snapshot()
    resp = _send(client, acme, "bind user", BOMB, content_type)
    assert resp.status_code == 400, resp.text
    assert "100000 levels deep" in error_message(resp)
    assert "RecursionError" not in caplog.text
    assert state_snapshot() == before


def test_brackets_inside_strings_do_not_count(client, acme, state_snapshot):
    before = state_snapshot()
    name = '[{\\"' * 40 + "]"
    resp = client.put(
        "/v1/users/u1",
        content=f'{{"adapter": "{name}"}}'.encode(),
        headers={**acme, "Content-Type": "application/json"},
    )
    assert resp.status_code == 400, resp.text
    assert error_message(resp).startswith("adapter name '[{\"[{")
    assert state_snapshot() == before


def test_moderately_nested_bodies_still_reach_validation(client, acme, state_snapshot):
    before = state_snapshot()
    resp = client.put("/v1/users/u1", json={"adapter": [[[["x"]]]]}, headers=acme)
    assert resp.status_code == 422
    assert error_message(resp) == "invalid request: adapter: Input should be a valid string"
    assert state_snapshot() == before
