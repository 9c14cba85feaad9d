"""Per-tenant quotas on adapter count and stored bytes: refused with 403 quota_exceeded
before anything is stored. The registry's defaults apply unless an admin set the tenant's
own (on create, or PATCH /v1/tenants/{tenant})."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from preft_serve.common.domain_errors import QuotaExceeded
from preft_serve.registry.quotas import Quota, QuotaOverrides, TenantUse, check_upload
from tests.support.registry_api import admin, bearer, create_tenant, error_message, upload


def test_adapter_count_quota(make_client, lora_dir, lora_dir2, state_snapshot) -> None:
    client: TestClient = make_client(tenant_max_adapters=1)
    acme = create_tenant(client, "acme")
    assert upload(client, acme, "one", lora_dir).status_code == 201
    before = state_snapshot()
    refused = upload(client, acme, "two", lora_dir2)
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "quota_exceeded"
    assert error_message(refused) == (
        "tenant acme has 1 adapters, its quota is 1 "
        "(max_adapters); delete one before creating another"
    )
    assert state_snapshot() == before  # nothing stored, no event
    # A new version of an existing adapter is not a new adapter.
    assert upload(client, acme, "one", lora_dir2, method="PUT").status_code == 201
    # Another tenant has its own count.
    assert upload(client, create_tenant(client, "globex"), "two", lora_dir2).status_code == 201


def test_stored_bytes_quota(make_client, lora_dir, lora_dir2, state_snapshot) -> None:
    client: TestClient = make_client()
    acme = create_tenant(client, "acme")
    first = upload(client, acme, "one", lora_dir)
    assert first.status_code == 201
    size = first.json()["size_bytes"]
    client = make_client(tenant_max_stored_bytes=max(1024, size + 1))
    before = state_snapshot()
    refused = upload(client, acme, "two", lora_dir2)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "quota_exceeded"
    assert f"tenant acme stores {size} bytes" in error_message(refused)
    assert "(max_stored_bytes)" in error_message(refused)
    assert state_snapshot() == before
    # Content the tenant already stores costs nothing more (a second name for it).
    assert upload(client, acme, "same", lora_dir).status_code == 201


@pytest.mark.parametrize(
    ("use", "new", "sha", "size", "ok"),
    [
        (TenantUse(2, 100, frozenset({"a"})), True, "b", 10, False),  # third adapter
        (TenantUse(2, 100, frozenset({"a"})), False, "b", 10, True),  # new version
        (TenantUse(1, 100, frozenset({"a"})), True, "b", 901, False),  # 1001 bytes
        (TenantUse(1, 100, frozenset({"a"})), True, "b", 900, True),  # exactly the quota
        (TenantUse(1, 1000, frozenset({"a"})), True, "a", 900, True),  # already stored
    ],
)
def test_check_upload(use: TenantUse, new: bool, sha: str, size: int, ok: bool) -> None:
    quota = Quota(max_adapters=2, max_stored_bytes=1000)
    if ok:
        check_upload(quota, use, "acme", new_adapter=new, sha256=sha, size_bytes=size)
    else:
        with pytest.raises(Exception, match="quota"):
            check_upload(quota, use, "acme", new_adapter=new, sha256=sha, size_bytes=size)


# Per-tenant overrides: set on create or with PATCH /v1/tenants/{tenant} (admin), stored in
# the tenant's record, shown by GET, used by the next upload's check.

DEFAULT_BYTES = 10 << 30  # PREFT_REGISTRY_TENANT_MAX_STORED_BYTES' default


def quota_of(client: TestClient, tenant: str) -> dict[str, int | None]:
    resp = client.get(f"/v1/tenants/{tenant}", headers=admin())
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["quota"])


def set_quota(client: TestClient, tenant: str, quota: object) -> Any:
    return client.patch(f"/v1/tenants/{tenant}", json={"quota": quota}, headers=admin())


def test_override_lower_than_the_default_refuses(
    make_client, lora_dir, lora_dir2, state_snapshot
) -> None:
    client: TestClient = make_client()  # defaults: 1000 adapters, 10 GiB
    created = client.post(
        "/v1/tenants", json={"name": "acme", "quota": {"max_adapters": 1}}, headers=admin()
    )
    assert created.status_code == 201, created.text
    assert created.json()["quota"] == {"max_adapters": 1, "max_stored_bytes": None}
    acme = bearer(created.json()["api_key"])
    assert upload(client, acme, "one", lora_dir).status_code == 201
    before = state_snapshot()
    refused = upload(client, acme, "two", lora_dir2)
    assert refused.status_code == 403, refused.text
    assert error_message(refused) == (
        "tenant acme has 1 adapters, its quota is 1 (max_adapters, this tenant's own; the "
        "default is 1000); delete one before creating another"
    )
    assert state_snapshot() == before
    # The byte quota too, set later: no new content at all.
    assert set_quota(client, "acme", {"max_stored_bytes": 0}).status_code == 200
    before = state_snapshot()
    refused = upload(client, acme, "one", lora_dir2, method="PUT")
    assert refused.status_code == 403, refused.text
    assert (
        f"would exceed its quota of 0 bytes (max_stored_bytes, this tenant's own; the "
        f"default is {DEFAULT_BYTES})"
    ) in error_message(refused)
    assert state_snapshot() == before
    # Other tenants keep the defaults.
    globex = create_tenant(client, "globex")
    assert upload(client, globex, "one", lora_dir).status_code == 201
    assert upload(client, globex, "two", lora_dir2).status_code == 201


def test_override_higher_than_the_default_allows(make_client, lora_dir, lora_dir2) -> None:
    client: TestClient = make_client(tenant_max_adapters=1)
    acme = create_tenant(client, "acme")
    assert upload(client, acme, "one", lora_dir).status_code == 201
    assert upload(client, acme, "two", lora_dir2).status_code == 403
    updated = set_quota(client, "acme", {"max_adapters": 2})
    assert updated.status_code == 200, updated.text
    assert updated.json()["quota"] == {"max_adapters": 2, "max_stored_bytes": None}
    assert upload(client, acme, "two", lora_dir2).status_code == 201
    # A PATCH changes only what it names; null goes back to the default.
    assert set_quota(client, "acme", {"max_stored_bytes": DEFAULT_BYTES * 2}).status_code == 200
    assert quota_of(client, "acme") == {"max_adapters": 2, "max_stored_bytes": DEFAULT_BYTES * 2}
    assert set_quota(client, "acme", {"max_adapters": None}).json()["quota"] == {
        "max_adapters": None,
        "max_stored_bytes": DEFAULT_BYTES * 2,
    }
    assert set_quota(client, "acme", None).json()["quota"] == {
        "max_adapters": None,
        "max_stored_bytes": None,
    }
    # Over the default again: what it holds stays, a third adapter is refused.
    refused = upload(client, acme, "three", lora_dir)
    assert refused.status_code == 403
    assert "its quota is 1 (max_adapters);" in error_message(refused)
    listed = client.get("/v1/tenants", headers=admin()).json()
    assert listed == [
        {
            "name": "acme",
            "created_at": listed[0]["created_at"],
            "adapters": 2,
            "quota": {"max_adapters": None, "max_stored_bytes": None},
        }
    ]


@pytest.mark.parametrize(
    ("quota", "field"),
    [
        ({"max_adapters": -1}, "quota.max_adapters"),
        ({"max_adapters": 1_000_001}, "quota.max_adapters"),
        ({"max_adapters": "5"}, "quota.max_adapters"),
        ({"max_adapters": True}, "quota.max_adapters"),
        ({"max_adapters": 2.5}, "quota.max_adapters"),
        ({"max_stored_bytes": (1 << 50) + 1}, "quota.max_stored_bytes"),
        ({"max_stored_bytes": -5}, "quota.max_stored_bytes"),
        ({"max_files": 3}, "quota.max_files"),
        ([1], "quota"),
    ],
)
def test_bad_overrides_are_422_and_change_nothing(
    make_client, state_snapshot, quota: object, field: str
) -> None:
    client: TestClient = make_client()
    create_tenant(client, "acme")
    assert set_quota(client, "acme", {"max_adapters": 7}).status_code == 200
    before = state_snapshot()
    for resp in (
        set_quota(client, "acme", quota),
        client.post("/v1/tenants", json={"name": "globex", "quota": quota}, headers=admin()),
    ):
        assert resp.status_code == 422, resp.text
        assert field in error_message(resp)
    assert state_snapshot() == before
    assert quota_of(client, "acme") == {"max_adapters": 7, "max_stored_bytes": None}
    unknown = client.patch("/v1/tenants/acme", json={"limits": {}}, headers=admin())
    assert unknown.status_code == 422 and "limits" in error_message(unknown)


def test_only_an_admin_sets_quotas(make_client, state_snapshot) -> None:
    client: TestClient = make_client()
    acme = create_tenant(client, "acme")
    before = state_snapshot()
    for headers in (acme, {}, bearer("not-the-admin-token-at-all")):
        resp = client.patch(
            "/v1/tenants/acme", json={"quota": {"max_adapters": 10**6}}, headers=headers
        )
        assert resp.status_code == 401, resp.text
    assert state_snapshot() == before
    missing = set_quota(client, "nobody", {"max_adapters": 1})
    assert missing.status_code == 404 and "does not exist" in error_message(missing)
    assert state_snapshot() == before


def test_check_upload_prefers_the_tenants_own_limits() -> None:
    quota = Quota(max_adapters=2, max_stored_bytes=1000)
    own = TenantUse(2, 100, frozenset(), QuotaOverrides(max_adapters=3, max_stored_bytes=150))
    check_upload(quota, own, "acme", new_adapter=True, sha256="b", size_bytes=50)
    with pytest.raises(
        QuotaExceeded,
        match=r"quota of 150 bytes \(max_stored_bytes, this "
        r"tenant's own; the default is 1000\)",
    ):
        check_upload(quota, own, "acme", new_adapter=False, sha256="b", size_bytes=51)


def test_an_integral_float_is_an_integer(make_client) -> None:
    """JSON has one number type and JSON Schema's ``integer`` admits ``3.0`` (found by the
    API fuzzer: ``{"max_adapters": 0.0}`` was a schema-valid request refused)."""
    client: TestClient = make_client()
    create_tenant(client, "acme")
    assert set_quota(client, "acme", {"max_adapters": 3.0}).status_code == 200
    assert quota_of(client, "acme") == {"max_adapters": 3, "max_stored_bytes": None}
