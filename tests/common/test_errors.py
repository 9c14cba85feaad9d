"""The shared error envelope on a minimal app (the gateway will reuse it)."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from preft_serve.common import domain_errors as domain
from preft_serve.common import errors
from preft_serve.common.errors import (
    Conflict,
    ErrorResponse,
    Unauthorized,
    error_responses,
    install_error_handlers,
)


class Body(BaseModel):
    count: int


def make_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/conflict", responses=error_responses(409))
    def conflict() -> None:
        raise Conflict(
            "thing 'x' exists; pick another name", param="name", details=[{"field": "name"}]
        )

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


def test_envelopes_are_openais():
    """OpenAI's four fields, ``type`` from the status (401 authentication_error, 409 and 422
    invalid_request_error, 500 server_error), ``details`` only where given."""
    client = TestClient(make_app(), raise_server_exceptions=False)
    resp = client.get("/conflict")
    assert resp.status_code == 409
    assert resp.json() == {
        "error": {
            "message": "thing 'x' exists; pick another name",
            "type": "invalid_request_error",
            "param": "name",
            "code": "conflict",
            "details": [{"field": "name"}],
        }
    }
    ErrorResponse.model_validate(resp.json())
    resp = client.get("/auth")
    assert resp.status_code == 401 and resp.headers["www-authenticate"] == "Bearer"
    assert resp.json() == {
        "error": {
            "message": "send a key",
            "type": "authentication_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    resp = client.post("/body", json={"count": "many"})
    assert resp.status_code == 422
    error = resp.json()["error"]
    assert error["message"] == (
        "invalid request: count: Input should be a valid integer, unable to parse string as "
        "an integer"
    )
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "count",
        "invalid_value",
    )
    assert error["details"][0]["field"] == "count"
    missing = client.post("/body", json={}).json()["error"]
    assert (missing["param"], missing["code"]) == ("count", "missing_required_parameter")
    resp = client.get("/boom")
    assert resp.status_code == 500
    assert resp.json()["error"] == {
        "type": "server_error",
        "param": None,
        "code": "internal_error",
        "message": "internal server error; the server log has details",
    }
    assert "secret internals" not in resp.text
    unknown = client.post("/v1/" + "x" * 500)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_url"
    assert len(unknown.json()["error"]["message"]) < 200  # the caller's path is cut short
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
        "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}
    }
    assert "HTTPValidationError" not in str(spec)
    assert {"ErrorBody", "ErrorResponse"} <= set(spec["components"]["schemas"])
    resp = TestClient(make_app()).get("/openapi.json")
    assert resp.json() == spec


# The status, code and headers each error answered with when domain code raised the
# HTTP-flavoured classes directly: the domain errors must answer exactly the same.
ANSWERS = [
    (domain.InvalidRequest, errors.BadRequest, 400, "invalid_value", "invalid_request_error"),
    (domain.Unauthenticated, errors.Unauthorized, 401, "invalid_api_key", "authentication_error"),
    (domain.QuotaExceeded, errors.QuotaExceeded, 403, "quota_exceeded", "permission_error"),
    (domain.NotFound, errors.NotFound, 404, "not_found", "invalid_request_error"),
    (domain.Conflict, errors.Conflict, 409, "conflict", "invalid_request_error"),
    (domain.TooLarge, errors.PayloadTooLarge, 413, "request_too_large", "invalid_request_error"),
    (
        domain.UnsupportedFormat,
        errors.UnsupportedMediaType,
        415,
        "unsupported_media_type",
        "invalid_request_error",
    ),
    (domain.InvalidContent, errors.Unprocessable, 422, "invalid_value", "invalid_request_error"),
    (domain.RateLimited, errors.TooManyRequests, 429, "rate_limit_exceeded", "rate_limit_error"),
    (domain.Unavailable, errors.ServiceUnavailable, 503, "service_unavailable", "server_error"),
]


@pytest.mark.parametrize("domain_class, http_class, status, code, kind", ANSWERS)
def test_a_domain_error_answers_as_its_http_twin(domain_class, http_class, status, code, kind):
    """Domain code raises errors that know no HTTP; the edge answers each with the status,
    envelope and headers the HTTP-flavoured class of the same meaning gives."""
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/domain")
    def raise_domain() -> None:
        raise domain_class("fix the thing", param="thing")

    @app.get("/http")
    def raise_http() -> None:
        raise http_class("fix the thing", param="thing")

    client = TestClient(app, raise_server_exceptions=False)
    from_domain, from_http = client.get("/domain"), client.get("/http")
    expected = {"error": {"message": "fix the thing", "type": kind, "param": "thing", "code": code}}
    for resp in (from_domain, from_http):
        assert resp.status_code == status
        assert resp.json() == expected
        assert resp.headers.get("www-authenticate") == ("Bearer" if status == 401 else None)
    assert issubclass(http_class, domain_class)  # an edge's raise is the domain error too
    assert http_class.http_status == status
    assert errors.http_status_of(domain_class) == status


def test_a_refined_code_and_an_unlisted_subclass_keep_their_status():
    class NoSuchJob(domain.NotFound):
        code = "job_not_found"

    app = FastAPI()
    install_error_handlers(app)

    @app.get("/job")
    def job() -> None:
        raise NoSuchJob("job ftjob-1 does not exist; GET /v1/fine_tuning/jobs lists yours")

    @app.get("/plain")
    def plain() -> None:
        raise domain.DomainError("no class of its own", code="odd")

    client = TestClient(app, raise_server_exceptions=False)
    resp = client.get("/job")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "job_not_found"
    resp = client.get("/plain")
    assert resp.status_code == 500 and resp.json()["error"]["code"] == "odd"


def test_an_edge_error_of_its_own_keeps_its_status():
    """An edge's error with no domain meaning (the gateway's 502 from a worker, 501 for a
    route this deployment does not serve) names its status itself."""

    class NotServedHere(errors.ServiceError):
        http_status = 501
        code = "not_configured"

    app = FastAPI()
    install_error_handlers(app)

    @app.get("/x")
    def x() -> None:
        raise NotServedHere("this deployment has no such backend")

    resp = TestClient(app).get("/x")
    assert resp.status_code == 501
    assert resp.json()["error"]["code"] == "not_configured"
