"""Per-tenant quotas on adapter count and stored bytes: refused with 403 quota_exceeded
before anything is stored."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from preft_serve.registry.quotas import Quota, TenantUse, check_upload

from tests.support.registry_api import create_tenant, error_message, upload


def test_adapter_count_quota(make_client, lora_dir, lora_dir2, state_snapshot) -> None:
    client: TestClient = make_client(tenant_max_adapters=1)
    acme = create_tenant(client, "acme")
    assert upload(client, acme, "one", lora_dir).status_code == 201
    before = state_snapshot()
    refused = upload(client, acme, "two", lora_dir2)
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "quota_exceeded"
    assert error_message(refused) == ("tenant acme has 1 adapters, its quota is 1 "
                                      "(max_adapters); delete one before creating another")
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


@pytest.mark.parametrize(("use", "new", "sha", "size", "ok"), [
    (TenantUse(2, 100, frozenset({"a"})), True, "b", 10, False),   # third adapter
    (TenantUse(2, 100, frozenset({"a"})), False, "b", 10, True),   # new version
    (TenantUse(1, 100, frozenset({"a"})), True, "b", 901, False),  # 1001 bytes
    (TenantUse(1, 100, frozenset({"a"})), True, "b", 900, True),   # exactly the quota
    (TenantUse(1, 1000, frozenset({"a"})), True, "a", 900, True),  # already stored
])
def test_check_upload(use: TenantUse, new: bool, sha: str, size: int, ok: bool) -> None:
    quota = Quota(max_adapters=2, max_stored_bytes=1000)
    if ok:
        check_upload(quota, use, "acme", new_adapter=new, sha256=sha, size_bytes=size)
    else:
        with pytest.raises(Exception, match="quota"):
            check_upload(quota, use, "acme", new_adapter=new, sha256=sha, size_bytes=size)
