"""The registry's OpenAPI document tells the truth about names and errors.

Found by the API fuzzer (tests/fuzz/test_registry_api.py, schemathesis): routes answered 400
for bad names where the document listed no 400 (ST103), the document allowed any string as
a name, so schema-valid requests were refused (ST202), and ``files`` allowed an empty list
that multipart cannot even send (a 422 "field required").
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from preft_serve.common.registry_client import is_adapter_name, is_tenant_name, is_user_id
from preft_serve.registry import names
from preft_serve.registry.app import create_app
from preft_serve.registry.settings import RegistrySettings
from tests.support.registry_api import ADMIN_TOKEN

PATTERNS = {
    "tenant": names.TENANT_PATTERN,
    "key_id": names.KEY_ID_PATTERN,
    "name": names.ADAPTER_PATTERN,
    "user_id": names.USER_PATTERN,
    "cursor": names.ADAPTER_PATTERN,
    "adapter": names.ADAPTER_PATTERN,
}
CURSORS = {"/v1/users": names.USER_PATTERN}  # a list's cursor is the id it is ordered by


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    settings = RegistrySettings.model_construct(admin_token=ADMIN_TOKEN, base_model=Path("."))
    return create_app(settings).openapi()


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, op) for path, ops in spec["paths"].items() for method, op in ops.items()]


def test_every_route_taking_a_name_documents_its_rule_and_the_400(spec: dict[str, Any]) -> None:
    checked = 0
    for method, path, op in _operations(spec):
        for param in op.get("parameters", []):
            if param["name"] in PATTERNS:
                rule = PATTERNS[param["name"]]
                if param["name"] == "cursor":
                    rule = CURSORS.get(path, rule)
                assert param["schema"].get("pattern") == rule or any(
                    s.get("pattern") == rule for s in param["schema"].get("anyOf", [])
                ), (method, path, param)
                assert "400" in op["responses"], (method, path)
                checked += 1
    assert checked == 30
    schemas = spec["components"]["schemas"]
    assert schemas["TenantCreate"]["properties"]["name"]["pattern"] == names.TENANT_PATTERN
    assert schemas["BindingIn"]["properties"]["adapter"]["pattern"] == names.ADAPTER_PATTERN
    upload = schemas["Body_upload_adapter_v1_adapters_post"]["properties"]
    assert upload["name"]["pattern"] == names.ADAPTER_PATTERN
    for body in (
        "Body_upload_adapter_v1_adapters_post",
        "Body_upload_version_v1_adapters__name__put",
    ):
        assert schemas[body]["properties"]["files"]["minItems"] == 1


SAMPLES = [
    "",
    "a",
    "ab",
    "acme",
    "a-b",
    "-ab",
    "Ab",
    "a" * 63,
    "a" * 64,
    "a" * 65,
    "a" * 128,
    "a" * 129,
    "bot",
    "bot..x",
    "bot.x",
    ".bot",
    "_bot",
    "bot\n",
    "bot:users",
    "b t",
    "alice@example.com",
    "u+1=2",
    "é",
    "0123456789ab",
    "0123456789AB",
    "0123456789a",
]


@pytest.mark.parametrize(
    ("pattern", "rule"),
    [
        (names.TENANT_PATTERN, is_tenant_name),
        (names.ADAPTER_PATTERN, is_adapter_name),
        (names.USER_PATTERN, is_user_id),
        (names.KEY_ID_PATTERN, lambda s: re.fullmatch(r"[0-9a-f]{12}", s) is not None),
    ],
)
def test_documented_patterns_are_the_rules_the_routes_check(pattern: str, rule: Any) -> None:
    # JSON Schema patterns are ECMA regexes searched anywhere; "$" must not allow a
    # trailing newline, so compare with \Z.
    compiled = re.compile(pattern.removesuffix("$") + r"\Z")
    for sample in SAMPLES:
        assert bool(compiled.search(sample)) == rule(sample), (pattern, sample)
