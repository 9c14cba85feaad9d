"""The shared error envelope on a minimal app (the gateway will reuse it)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from preft_serve.common.errors import (
    Conflict,
    ErrorResponse,
    Unauthorized,
    error_responses,
    install_error_handlers,
)
from pydantic import BaseModel


class Body(BaseModel):
    count: int


def make_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/conflict", responses=error_responses(409))
    def conflict() -> None:
        raise Conflict("thing 'x' exists; pick another name", details=[{"field": "name"}])

    @app.get("/auth")
    def auth() -> None:
        raise Unauthorized("send a key")

    @app.post("/body")
    def body(b: Body) -> int:
        return b.count

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret internals")

    return app


def test_envelopes():
    client = TestClient(make_app(), raise_server_exceptions=False)
    resp = client.get("/conflict")
    assert resp.status_code == 409
    assert resp.json() == {"error": {"code": "conflict", "message": "thing 'x' exists; pick "
                                     "another name", "details": [{"field": "name"}]}}
    ErrorResponse.model_validate(resp.json())
    resp = client.get("/auth")
    assert resp.status_code == 401 and resp.headers["www-authenticate"] == "Bearer"
    resp = client.post("/body", json={"count": "many"})
    assert resp.status_code == 422
    assert resp.json()["error"]["message"] == (
        "invalid request: count: Input should be a valid integer, unable to parse string as "
        "an integer")
    assert resp.json()["error"]["details"][0]["field"] == "count"
    resp = client.get("/boom")
    assert resp.status_code == 500
    assert resp.json()["error"] == {"code": "internal", "details": None,
                                    "message": "internal server error; the server log has "
                                               "details"}
    assert "secret internals" not in resp.text
    spec = make_app().openapi()
    assert "ErrorResponse" in spec["components"]["schemas"]


def test_405_allow_lists_every_method_of_the_path():
    """Starlette's 405 named only the first matching route's methods (``OPTIONS
    /v1/users/alice`` -> ``Allow: PUT`` though GET and DELETE work too); found by the API
    fuzzer (tests/fuzz, schemathesis ST205)."""
    app = FastAPI()
    install_error_handlers(app)
    app.put("/users/{user}")(lambda user: None)
    app.get("/users/{user}")(lambda user: None)
    app.delete("/users/{user}")(lambda user: None)
    app.post("/other")(lambda: None)
    client = TestClient(app, raise_server_exceptions=False)
    for method in ("OPTIONS", "PATCH", "POST"):
        resp = client.request(method, "/users/alice")
        assert resp.status_code == 405
        assert resp.headers["allow"] == "DELETE, GET, PUT"
        assert resp.json()["error"]["code"] == "method_not_allowed"
    assert client.get("/other").headers["allow"] == "POST"


def test_422_is_documented_as_the_envelope_it_is():
    """FastAPI documented its own ``{"detail": [...]}`` 422 on every route with parameters
    while the answer is the envelope (the fuzzer's schema check passed only because that
    schema requires nothing)."""
    spec = make_app().openapi()
    assert spec["paths"]["/body"]["post"]["responses"]["422"]["content"] == {
        "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    assert "HTTPValidationError" not in str(spec)
    assert {"ErrorBody", "ErrorResponse"} <= set(spec["components"]["schemas"])
    resp = TestClient(make_app()).get("/openapi.json")
    assert resp.json() == spec
