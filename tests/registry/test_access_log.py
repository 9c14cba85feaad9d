"""The registry's access log: one line per request with its id, tenant (or admin), route
template, status and latency; never a key, token or uploaded content. The id comes back
in ``x-request-id``."""

from __future__ import annotations

import logging
import re

import pytest

from preft_serve.registry.app import ACCESS_LOGGER
from tests.support.registry_api import ADMIN_TOKEN, admin, bearer

HEX_ID = re.compile(r"[0-9a-f]{32}")


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == ACCESS_LOGGER]


def test_one_line_per_request_with_id_tenant_route_status(client, caplog):
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    created = client.post(
        "/v1/tenants", json={"name": "acme"}, headers={**admin(), "X-Request-Id": "mk-acme"}
    )
    assert created.status_code == 201 and created.headers["x-request-id"] == "mk-acme"
    api_key = created.json()["api_key"]
    missing = client.get("/v1/adapters/bot", headers=bearer(api_key))
    assert missing.status_code == 404 and HEX_ID.fullmatch(missing.headers["x-request-id"])
    denied = client.get(
        "/v1/adapters", headers={**bearer("pft_abc.wrongsecret"), "X-Request-Id": "x" * 200}
    )
    assert denied.status_code == 401 and HEX_ID.fullmatch(denied.headers["x-request-id"])

    admin_line, tenant_line, denied_line = lines(caplog)
    assert (
        admin_line.request_id,
        admin_line.route,
        admin_line.status,
        admin_line.admin,  # type: ignore[attr-defined]
        admin_line.method,
    ) == ("mk-acme", "/v1/tenants", 201, True, "POST")  # type: ignore[attr-defined]
    assert not hasattr(admin_line, "tenant")
    assert (
        tenant_line.request_id,
        tenant_line.tenant,
        tenant_line.route,  # type: ignore[attr-defined]
        tenant_line.status,
    ) == (
        missing.headers["x-request-id"],
        "acme",  # type: ignore[attr-defined]
        "/v1/adapters/{name}",
        404,
    )
    assert isinstance(tenant_line.latency_ms, float)  # type: ignore[attr-defined]
    assert denied_line.status == 401 and not hasattr(denied_line, "tenant")  # type: ignore[attr-defined]
    assert denied_line.request_id == denied.headers["x-request-id"]  # type: ignore[attr-defined]
    logged = " ".join(str(vars(r)) for r in lines(caplog))
    for secret in (api_key, api_key.split(".")[-1], ADMIN_TOKEN, "wrongsecret"):
        assert secret not in logged


def test_unknown_routes_are_logged_as_unmatched(client, caplog):
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    assert client.get("/v2/nothing").status_code == 404
    [line] = lines(caplog)
    assert (line.route, line.status) == ("unmatched", 404)  # type: ignore[attr-defined]
