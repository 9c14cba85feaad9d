"""The audit log: every change through the API leaves one entry naming the key (never its
secret), the target and what it was before and after; a tenant reads only its own; pages
cover everything once; retention bounds hold; bad filters are 400s that say what to send."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from preft_serve.common.audit_wire import AuditAction
from preft_serve.registry import audit
from preft_serve.registry.audit import MAX_LIMIT
from preft_serve.registry.finetune.settings import FinetuneSettings
from tests.support.registry_api import ADMIN_TOKEN, admin, bearer, error_message, upload

AUDIT = "/v1/audit"
JOBS = "/v1/fine_tuning/jobs"
TRAINING = (
    json.dumps(
        {
            "messages": [
                {"role": "user", "content": "Hi?"},
                {"role": "assistant", "content": "Fine."},
            ]
        }
    )
    + "\n"
)


@pytest.fixture
def ft_client(make_client: Callable[..., TestClient], tmp_path: Path) -> TestClient:
    """Fine-tuning on, with a dispatcher that never ticks after start: jobs stay queued."""
    return make_client(finetune=FinetuneSettings(poll_s=60, work_dir=tmp_path))


def _tenant(client: TestClient, name: str) -> tuple[dict[str, str], str, str]:
    """(headers, key id, the key itself) of a new tenant."""
    made = client.post("/v1/tenants", json={"name": name}, headers=admin())
    assert made.status_code == 201, made.text
    return bearer(made.json()["api_key"]), made.json()["key_id"], made.json()["api_key"]


def _read_all(client: TestClient, headers: dict[str, str], **params: Any) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    after = None
    while True:
        page = client.get(
            AUDIT, headers=headers, params={**params, **({"after": after} if after else {})}
        )
        assert page.status_code == 200, page.text
        entries += page.json()["data"]
        after = page.json()["next_cursor"]
        if after is None:
            return entries


def _summary(entries: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (e["tenant"], e["actor"], e["action"], e["target"], e["before"], e["after"])
        for e in entries
    ]


def _bind(client: TestClient, headers: dict[str, str], user: str, adapter: str) -> None:
    resp = client.put(f"/v1/users/{user}", json={"adapter": adapter}, headers=headers)
    assert resp.status_code == 200, resp.text


def test_each_change_is_one_entry_with_actor_target_before_and_after(
    ft_client: TestClient, lora_dir: Path, lora_dir2: Path
) -> None:
    client = ft_client
    headers, key_id, _ = _tenant(client, "acme")
    other = client.post("/v1/tenants/acme/keys", headers=admin()).json()["key_id"]
    assert client.delete(f"/v1/tenants/acme/keys/{other}", headers=admin()).status_code == 204
    assert (
        client.patch(
            "/v1/tenants/acme", json={"quota": {"max_adapters": 5}}, headers=admin()
        ).status_code
        == 200
    )
    assert (
        client.put("/v1/tenants/acme/limits", json={"tenant_rps": 2.5}, headers=admin()).status_code
        == 200
    )
    v1 = upload(client, headers, "chat", lora_dir).json()
    v2 = upload(client, headers, "chat", lora_dir2, method="PUT").json()
    assert upload(client, headers, "chat", lora_dir2, method="PUT").status_code == 200  # no-op
    v3 = client.post("/v1/adapters/chat/rollback", json={"version": 1}, headers=headers).json()
    canary = {"version": 3, "canary": {"version": 2, "weight": 0.5}}
    assert client.put("/v1/adapters/chat/policy", json=canary, headers=headers).status_code == 200
    _bind(client, {**headers, "X-Request-Id": "bind-alice-1"}, "alice", "chat")
    _bind(client, headers, "alice", "chat")  # unchanged: no entry
    assert client.delete("/v1/users/alice", headers=headers).status_code == 204
    file = client.post(
        "/v1/files",
        headers=headers,
        data={"purpose": "fine-tune"},
        files={"file": ("train.jsonl", TRAINING.encode(), "application/jsonl")},
    )
    assert file.status_code == 200, file.text
    file_id = file.json()["id"]
    job = client.post(
        JOBS,
        headers=headers,
        json={"model": "tiny-llama", "training_file": file_id, "method": {"type": "preft"}},
    )
    assert job.status_code == 200, job.text
    job_id = job.json()["id"]
    assert client.post(f"{JOBS}/{job_id}/cancel", headers=headers).status_code == 200
    assert client.delete(f"/v1/files/{file_id}", headers=headers).status_code == 200
    assert client.delete("/v1/adapters/chat", headers=headers).status_code == 204

    sha = hashlib.sha256(TRAINING.encode()).hexdigest()
    ver = [f"v{v['version']}:{v['sha256']}" for v in (v1, v2, v3)]
    assert [v["version"] for v in (v1, v2, v3)] == [1, 2, 3]
    op = "operator"
    expected = [
        ("acme", op, "tenant.create", "acme", None, key_id),
        ("acme", op, "key.create", other, None, other),
        ("acme", op, "key.revoke", other, other, None),
        (
            "acme",
            op,
            "tenant.update",
            "acme",
            '{"quota":{},"unbound_user":"base_model"}',
            '{"quota":{"max_adapters":5},"unbound_user":"base_model"}',
        ),
        ("acme", op, "tenant.rate_limits", "acme", "{}", '{"tenant_rps":2.5}'),
        ("acme", key_id, "adapter.upload", "chat", None, ver[0]),
        ("acme", key_id, "adapter.version", "chat", ver[0], ver[1]),
        ("acme", key_id, "adapter.rollback", "chat", ver[1], ver[2]),
        ("acme", key_id, "adapter.policy", "chat", ver[2], f"{ver[2]} canary {ver[1]} weight 0.5"),
        ("acme", key_id, "binding.set", "alice", None, "chat"),
        ("acme", key_id, "binding.delete", "alice", "chat", None),
        ("acme", key_id, "file.upload", file_id, None, sha),
        ("acme", key_id, "fine_tuning.job.create", job_id, None, "queued"),
        ("acme", key_id, "fine_tuning.job.cancel", job_id, "queued", "cancelled"),
        ("acme", key_id, "file.delete", file_id, sha, None),
        ("acme", key_id, "adapter.delete", "chat", ver[2], None),
    ]
    entries = _read_all(client, headers)
    assert _summary(entries) == expected
    assert v3["sha256"] == v1["sha256"]  # the rollback's content is version 1's
    binding = next(e for e in entries if e["action"] == "binding.set")
    assert binding["request_id"] == "bind-alice-1"
    assert all(e["request_id"] for e in entries)
    assert _summary(_read_all(client, admin())) == expected
    recorded = {e["action"] for e in entries} | {"tenant.delete"}
    assert client.delete("/v1/tenants/acme", headers=admin()).status_code == 200
    assert _summary(_read_all(client, admin(), action="tenant.delete")) == [
        ("acme", op, "tenant.delete", "acme", None, None)
    ]
    assert recorded == {a.value for a in AuditAction}


def test_a_tenant_never_sees_another_tenants_entries(client: TestClient, lora_dir: Path) -> None:
    a_headers, a_key, _ = _tenant(client, "acme")
    b_headers, b_key, _ = _tenant(client, "globex")
    assert upload(client, a_headers, "chat", lora_dir).status_code == 201
    _bind(client, a_headers, "alice", "chat")
    assert upload(client, b_headers, "tool", lora_dir).status_code == 201

    b_log = _read_all(client, b_headers)
    assert {e["tenant"] for e in b_log} == {"globex"}
    assert [e["action"] for e in b_log] == ["tenant.create", "adapter.upload"]
    for params in (
        {"actor": a_key},
        {"action": "binding.set"},
        {"since": "0"},
        {"tenant": "globex"},
    ):
        assert all(e["tenant"] == "globex" for e in _read_all(client, b_headers, **params))
    assert _read_all(client, b_headers, actor=a_key) == []
    refused = client.get(AUDIT, headers=b_headers, params={"tenant": "acme"})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "tenant"
    assert "its own tenant" in error_message(refused)

    everything = _read_all(client, admin())
    assert {e["tenant"] for e in everything} == {"acme", "globex"}
    assert [e["action"] for e in _read_all(client, admin(), tenant="acme")] == [
        "tenant.create",
        "adapter.upload",
        "binding.set",
    ]
    assert [e["actor"] for e in _read_all(client, admin(), actor=b_key)] == [b_key]


def test_pages_cover_every_entry_once_in_order(client: TestClient, lora_dir: Path) -> None:
    headers, _, _ = _tenant(client, "acme")
    assert upload(client, headers, "chat", lora_dir).status_code == 201
    for i in range(23):
        _bind(client, headers, f"user-{i}", "chat")
    whole = client.get(AUDIT, headers=headers, params={"limit": MAX_LIMIT}).json()
    assert whole["next_cursor"] is None and len(whole["data"]) == 25

    seen: list[str] = []
    after = None
    pages = 0
    while True:
        page = client.get(
            AUDIT, headers=headers, params={"limit": 7, **({"after": after} if after else {})}
        ).json()
        assert len(page["data"]) <= 7
        seen += [e["id"] for e in page["data"]]
        pages += 1
        after = page["next_cursor"]
        if after is None:
            break
    assert pages == 4
    assert seen == [e["id"] for e in whole["data"]]
    assert len(set(seen)) == 25
    users = [e["target"] for e in _read_all(client, headers, action="binding.set", limit=5)]
    assert users == [f"user-{i}" for i in range(23)]


def test_time_filters_bound_the_range(client: TestClient, lora_dir: Path) -> None:
    headers, _, _ = _tenant(client, "acme")
    assert upload(client, headers, "chat", lora_dir).status_code == 201
    entries = _read_all(client, headers)
    upload_ms = int(entries[1]["id"].split("-")[0])
    since = _read_all(client, headers, since=f"{upload_ms / 1000:.3f}")
    assert [e["action"] for e in since] == ["adapter.upload"]
    until = _read_all(client, headers, until=str((upload_ms - 1) / 1000))
    assert all(int(e["id"].split("-")[0]) < upload_ms for e in until)
    rfc = entries[1]["time"]
    assert [e["action"] for e in _read_all(client, headers, since=rfc, until=rfc)] == [
        "adapter.upload"
    ]
    assert _read_all(client, headers, since="2999-01-01T00:00:00+00:00") == []


def test_retention_keeps_the_newest_entries_up_to_the_cap(
    make_client: Callable[..., TestClient],
    lora_dir: Path,
    redis_client: redis.Redis,
    namespace: str,
) -> None:
    client = make_client(audit_max_entries=10, audit_max_entries_all=12)
    headers, _, _ = _tenant(client, "acme")
    assert upload(client, headers, "chat", lora_dir).status_code == 201
    for i in range(15):
        _bind(client, headers, f"user-{i}", "chat")
    kept = _read_all(client, headers)
    assert [e["target"] for e in kept] == [f"user-{i}" for i in range(5, 15)]
    assert redis_client.xlen(f"{namespace}:audit:tenant:acme") == 10
    assert len(_read_all(client, admin())) == 12


def test_entries_older_than_the_max_age_are_neither_served_nor_kept(
    make_client: Callable[..., TestClient],
    lora_dir: Path,
    redis_client: redis.Redis,
    namespace: str,
) -> None:
    client = make_client(audit_max_age_s=1)  # model_copy: below the setting's floor, for speed
    headers, _, _ = _tenant(client, "acme")
    assert len(_read_all(client, headers)) == 1
    time.sleep(2.1)
    assert _read_all(client, headers) == []
    assert upload(client, headers, "chat", lora_dir).status_code == 201
    assert [e["action"] for e in _read_all(client, headers)] == ["adapter.upload"]
    assert redis_client.xlen(f"{namespace}:audit:tenant:acme") == 1


@pytest.mark.parametrize(
    ("params", "param", "says"),
    [
        ({"limit": 0}, "limit", f"1 to {MAX_LIMIT}"),
        ({"limit": MAX_LIMIT + 1}, "limit", f"1 to {MAX_LIMIT}"),
        ({"since": "yesterday"}, "since", "RFC 3339"),
        ({"until": "2026-13-01T00:00:00Z"}, "until", "RFC 3339"),
        ({"since": "2026-01-01T10:00:00"}, "since", "time zone"),
        ({"since": "9" * 70}, "since", "too long"),
        ({"since": "999999999999"}, "since", "between 1970 and 9999"),
        ({"since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "since", "swap"),
        ({"actor": "pft_abc.secret"}, "actor", "12 hex digits"),
        ({"action": "adapter.explode"}, "action", "adapter.upload"),
        ({"after": "not-a-cursor"}, "after", "next_cursor"),
        ({"tenant": "Bad_Name"}, "tenant", "tenant name"),
    ],
)
def test_a_bad_filter_is_a_400_that_says_what_to_send(
    client: TestClient, params: dict[str, Any], param: str, says: str
) -> None:
    _tenant(client, "acme")
    resp = client.get(AUDIT, headers=admin(), params=params)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
    assert says in error_message(resp)


def test_reading_needs_a_key_or_the_admin_token(client: TestClient) -> None:
    assert client.get(AUDIT).status_code == 401
    assert client.get(AUDIT, headers=bearer("pft_000000000000.nope")).status_code == 401
    assert client.get(AUDIT, headers=bearer("not-the-admin-token")).status_code == 401


def test_no_secret_is_ever_recorded(
    client: TestClient, lora_dir: Path, redis_client: redis.Redis, namespace: str
) -> None:
    headers, key_id, api_key = _tenant(client, "acme")
    second = client.post("/v1/tenants/acme/keys", headers=admin()).json()
    assert upload(client, headers, "chat", lora_dir).status_code == 201
    _bind(client, bearer(second["api_key"]), "alice", "chat")
    entries = _read_all(client, admin())
    assert {e["actor"] for e in entries} == {"operator", key_id, second["key_id"]}
    stored = json.dumps(
        [redis_client.xrange(k) for k in redis_client.scan_iter(f"{namespace}:audit:*")]
    )
    secrets_ = (api_key, api_key.split(".", 1)[1], second["api_key"].split(".", 1)[1], ADMIN_TOKEN)
    for secret in secrets_:
        assert secret not in stored
        assert secret not in json.dumps(entries)
    assert key_id in stored


def test_a_failed_audit_write_keeps_the_change_and_is_counted(
    client: TestClient, lora_dir: Path, redis_client: redis.Redis, namespace: str
) -> None:
    headers, _, _ = _tenant(client, "acme")
    redis_client.set(f"{namespace}:audit:all", "not a stream")  # every XADD now fails
    resp = upload(client, headers, "chat", lora_dir)
    assert resp.status_code == 201, resp.text
    assert client.get("/v1/adapters/chat", headers=headers).json()["version"] == 1
    metrics = client.get("/metrics").text
    assert "preft_registry_audit_write_failures_total 1.0" in metrics


def test_a_sparse_filter_returns_short_pages_with_a_cursor_not_a_long_scan(
    client: TestClient, lora_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit, "MAX_SCAN", 5)
    headers, _, _ = _tenant(client, "acme")
    assert upload(client, headers, "chat", lora_dir).status_code == 201
    for i in range(12):
        _bind(client, headers, f"user-{i}", "chat")
    assert client.delete("/v1/users/user-11", headers=headers).status_code == 204
    first = client.get(AUDIT, headers=headers, params={"action": "binding.delete"}).json()
    assert first["data"] == [] and first["next_cursor"] is not None
    found = _read_all(client, headers, action="binding.delete")
    assert [(e["target"], e["before"]) for e in found] == [("user-11", "chat")]


def test_a_tenant_created_again_under_a_name_cannot_read_its_predecessors_log(
    client: TestClient, lora_dir: Path
) -> None:
    old, _, _ = _tenant(client, "acme")
    assert upload(client, old, "chat", lora_dir).status_code == 201
    assert client.delete("/v1/tenants/acme", headers=admin()).status_code == 200
    new, new_key, _ = _tenant(client, "acme")
    assert _summary(_read_all(client, new)) == [
        ("acme", "operator", "tenant.delete", "acme", None, None),
        ("acme", "operator", "tenant.create", "acme", None, new_key),
    ]
    assert [e["action"] for e in _read_all(client, admin())] == [
        "tenant.create",
        "adapter.upload",
        "tenant.delete",
        "tenant.create",
    ]
