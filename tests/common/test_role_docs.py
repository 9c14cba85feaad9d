"""Both OpenAPI documents list 403 on exactly the tenant routes a key's role can be refused.

The reference is ``common.key_roles``: a route's permission needs some role above the
least one (``inference``) iff a lesser key gets ``insufficient_role`` there, so the
document must say 403 there, and must not promise one where every key is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from preft_serve.common import key_roles
from preft_serve.gateway.app import create_app as gateway_app
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.registry.app import create_app as registry_app
from preft_serve.registry.settings import RegistrySettings
from tests.support.registry_api import ADMIN_TOKEN


def _registry() -> dict[str, Any]:
    settings = RegistrySettings.model_construct(admin_token=ADMIN_TOKEN, base_model=Path("."))
    return registry_app(settings).openapi()


def _gateway() -> dict[str, Any]:
    settings = GatewaySettings(worker_urls=["http://w1:8000"], base_model_name="tiny")
    return gateway_app(settings).openapi()


def _tenant_operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, operation) for every route a tenant API key may call."""
    return [
        (method.upper(), path, op)
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
        if any("TenantApiKey" in requirement for requirement in op.get("security", []))
    ]


def _refuses_some_role(method: str, path: str) -> bool:
    """Whether some role gets ``insufficient_role`` here: asked of ``key_roles.check``."""
    refused = []
    for role in key_roles.KeyRole:
        try:
            key_roles.check(role, method, path)
        except key_roles.InsufficientRole:
            refused.append(role)
    return bool(refused)


@pytest.mark.parametrize("document", [_registry, _gateway], ids=["registry", "gateway"])
def test_403_is_listed_exactly_where_a_role_is_refused(document: Any) -> None:
    spec = document()
    operations = _tenant_operations(spec)
    wrong = [
        (method, path)
        for method, path, op in operations
        if ("403" in op["responses"]) != _refuses_some_role(method, path)
    ]
    assert wrong == []
    refused = [(m, p) for m, p, _ in operations if _refuses_some_role(m, p)]
    allowed = [(m, p) for m, p, _ in operations if not _refuses_some_role(m, p)]
    # Both kinds occur in the gateway's document (inference routes are open to every role);
    # the registry serves no inference, so all of its tenant routes are role-checked.
    assert len(refused) >= 20
    if document is _gateway:
        assert ("POST", "/v1/chat/completions") in allowed
        assert ("DELETE", "/v1/models/{model}") in refused
    for method, path, op in operations:
        if "403" in op["responses"]:
            schema = op["responses"]["403"]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (method, path)


def test_the_audit_route_counts_as_a_tenant_route() -> None:
    # The registry's audit log takes the admin token or a tenant key; a tenant key's
    # role is checked, so it is one of the routes above.
    ops = {(m, p) for m, p, _ in _tenant_operations(_registry())}
    assert ("GET", "/v1/audit") in ops
    assert ("GET", "/v1/tenants") not in ops
