"""Upload, versions (hot swap), idempotence, listing, history, deletion, storage layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from preft_serve.adapters.format import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    adapter_digest,
    canonical_config_bytes,
    read_config,
)
from preft_serve.common.registry_client import RegistryKeys
from tests.registry import factories
from tests.support.registry_api import error_message, upload


def _expected_digest(adapter_dir: Path, mode: str) -> tuple[str, dict]:
    config = {**read_config(adapter_dir), "preft_mode": mode}
    return adapter_digest(config, (adapter_dir / WEIGHTS_FILE).read_bytes()), config


def test_upload_returns_identity_and_stores_canonical_blob(
    client, acme, lora_dir, s3, bucket, redis_client, namespace
):
    resp = upload(client, acme, "support-bot", lora_dir, mode="all")
    assert resp.status_code == 201, resp.text
    body = resp.json()
    digest, config = _expected_digest(lora_dir, "all")
    assert {k: body[k] for k in ("name", "version", "sha256", "type", "rank", "mode")} == {
        "name": "support-bot",
        "version": 1,
        "sha256": digest,
        "type": "lora",
        "rank": 8,
        "mode": "all",
    }
    assert body["base_model"] == "tiny-llama"
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == [f"adapters/{digest}/{CONFIG_FILE}", f"adapters/{digest}/{WEIGHTS_FILE}"]
    stored_config = s3.get_object(Bucket=bucket, Key=keys[0])["Body"].read()
    assert stored_config == canonical_config_bytes(config)
    assert json.loads(stored_config)["preft_mode"] == "all"  # overrides the file's "prefill"
    stored_weights = s3.get_object(Bucket=bucket, Key=keys[1])["Body"].read()
    assert stored_weights == (lora_dir / WEIGHTS_FILE).read_bytes()
    # A worker can load by digest alone: blob record in Redis plus verified fetch. The
    # record is fixed fields only (the config, sized by the tenant, stays in the store),
    # and size_bytes is what the store keeps: weights and normalised config.
    blob = redis_client.hgetall(RegistryKeys(namespace).blob(digest))
    assert blob == {
        "sha256": digest,
        "type": "lora",
        "mode": "all",
        "rank": "8",
        "base_model": "tiny-llama",
        "size_bytes": str(len(stored_weights) + len(stored_config)),
        "gen": "1",  # versions that referenced it (blob_gc)
    }
    assert body["size_bytes"] == len(stored_weights) + len(stored_config)


def test_fetch_by_digest_verifies(client, acme, lora_dir, settings, tmp_path):
    digest = upload(client, acme, "bot", lora_dir).json()["sha256"]
    store = settings.object_store.create()
    out = store.fetch_adapter(digest, tmp_path / "fetched")
    assert adapter_digest(read_config(out), (out / WEIGHTS_FILE).read_bytes()) == digest


def test_mode_changes_identity(client, acme, lora_dir):
    a = upload(client, acme, "a", lora_dir, mode="prefill").json()
    b = upload(client, acme, "b", lora_dir, mode="all").json()
    assert a["sha256"] != b["sha256"]


def test_identical_reupload_is_idempotent(client, acme, lora_dir, state_snapshot):
    first = upload(client, acme, "bot", lora_dir)
    assert first.status_code == 201
    before = state_snapshot()
    again = upload(client, acme, "bot", lora_dir)
    assert again.status_code == 200
    assert again.json() == first.json()
    put = upload(client, acme, "bot", lora_dir, method="PUT")
    assert put.status_code == 200
    assert put.json()["version"] == 1
    assert state_snapshot() == before  # no new version, no event, no new object


def test_post_existing_name_with_new_content_conflicts(
    client, acme, lora_dir, lora_dir2, state_snapshot
):
    upload(client, acme, "bot", lora_dir)
    before = state_snapshot()
    resp = upload(client, acme, "bot", lora_dir2)
    assert resp.status_code == 409
    assert error_message(resp) == (
        "adapter 'bot' already exists (version 1); upload a new version with PUT /v1/adapters/bot"
    )
    assert state_snapshot() == before


def test_put_hot_swap_versions_and_history(client, acme, lora_dir, lora_dir2):
    v1 = upload(client, acme, "bot", lora_dir).json()
    v2 = upload(client, acme, "bot", lora_dir2, method="PUT").json()
    v3 = upload(client, acme, "bot", lora_dir, method="PUT").json()  # roll back = new version
    assert (v1["version"], v2["version"], v3["version"]) == (1, 2, 3)
    assert v3["sha256"] == v1["sha256"] != v2["sha256"]
    detail = client.get("/v1/adapters/bot", headers=acme).json()
    assert detail["version"] == 3 and detail["sha256"] == v1["sha256"]
    assert [v["version"] for v in detail["versions"]] == [1, 2, 3]
    assert [v["sha256"] for v in detail["versions"]] == [v1["sha256"], v2["sha256"], v1["sha256"]]
    assert detail["created_at"] == v1["created_at"]
    assert detail["updated_at"] == v3["created_at"]


def test_put_without_mode_keeps_current_mode(client, acme, lora_dir, lora_dir2):
    upload(client, acme, "bot", lora_dir, mode="all")
    files = [("files", (p.name, p.read_bytes())) for p in sorted(lora_dir2.iterdir())]
    resp = client.put("/v1/adapters/bot", files=files, headers=acme)
    assert resp.status_code == 201
    assert resp.json()["mode"] == "all"


def test_put_creates_new_adapter_but_needs_mode(client, acme, lora_dir, state_snapshot):
    files = [("files", (p.name, p.read_bytes())) for p in sorted(lora_dir.iterdir())]
    before = state_snapshot()
    resp = client.put("/v1/adapters/new", files=files, headers=acme)
    assert resp.status_code == 400
    assert error_message(resp) == "field 'mode' is required for a new adapter: prefill or all"
    assert state_snapshot() == before
    resp = client.put("/v1/adapters/new", data={"mode": "prefill"}, files=files, headers=acme)
    assert resp.status_code == 201 and resp.json()["version"] == 1


def test_list_paginates_by_name(client, acme, lora_dir):
    names = [f"a{i:02d}" for i in range(7)]
    for name in reversed(names):
        assert upload(client, acme, name, lora_dir).status_code == 201
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/adapters", params=params, headers=acme).json()
        seen += [item["name"] for item in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == names and pages == 3
    resp = client.get("/v1/adapters", params={"limit": 0}, headers=acme)
    assert resp.status_code == 422
    assert "limit: Input should be greater than or equal to 1" in error_message(resp)


def test_get_missing_adapter(client, acme):
    resp = client.get("/v1/adapters/nope", headers=acme)
    assert resp.status_code == 404
    assert error_message(resp) == "adapter 'nope' does not exist"


def test_delete_refuses_bound_adapter_unless_forced(client, acme, lora_dir, state_snapshot):
    upload(client, acme, "bot", lora_dir)
    assert client.put("/v1/users/u1", json={"adapter": "bot"}, headers=acme).status_code == 200
    before = state_snapshot()
    resp = client.delete("/v1/adapters/bot", headers=acme)
    assert resp.status_code == 409
    assert error_message(resp) == (
        "adapter 'bot' is bound to 1 user(s); unbind them first or "
        "delete with ?force=true, which also unbinds them"
    )
    assert state_snapshot() == before
    assert (
        client.delete("/v1/adapters/bot", params={"force": True}, headers=acme).status_code == 204
    )
    assert client.get("/v1/adapters/bot", headers=acme).status_code == 404
    resp = client.get("/v1/users/u1", headers=acme)
    assert resp.status_code == 404
    assert error_message(resp) == "user 'u1' is not bound to an adapter"
    assert client.get("/v1/adapters", headers=acme).json()["items"] == []


def test_delete_then_recreate_starts_at_version_one(client, acme, lora_dir, s3, bucket):
    digest = upload(client, acme, "bot", lora_dir).json()["sha256"]
    assert client.delete("/v1/adapters/bot", headers=acme).status_code == 204
    client.app.state.registry.adapters.collector.wait()  # its thread deletes the content
    assert s3.list_objects_v2(Bucket=bucket).get("Contents", []) == []  # referenced by none
    again = upload(client, acme, "bot", lora_dir).json()
    assert again["version"] == 1 and again["sha256"] == digest
    resp = client.delete("/v1/adapters/ghost", headers=acme)
    assert resp.status_code == 404


@pytest.mark.parametrize("reft_type", ["direft", "loreft"])
@pytest.mark.parametrize(
    "positions,share", [("f1+l1", True), ("f2+l2", False), ("prefill", False), ("l3", False)]
)
def test_reft_adapters_accepted(
    reft_type, positions, share, client, acme, base_model_dir, tmp_path
):
    adapter = factories.reft(
        base_model_dir, tmp_path / "reft", reft_type, rank=4, positions=positions, share=share
    )
    resp = upload(client, acme, "reft", adapter)
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert (body["type"], body["rank"], body["mode"]) == (reft_type, 4, "prefill")


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "direft", "positions": "f3+l3", "share_weights": False},
        {"type": "loreft", "positions": "f2+l2", "share_weights": True},
        {"type": "loreft", "positions": "prefill", "share_weights": False},
        {"type": "direft", "positions": "l4", "share_weights": False},
    ],
)
def test_worker_toymodel_reft_adapters_accepted(spec, client, acme, base_model_dir, tmp_path):
    """The generator the worker's tests use produces adapters the registry accepts."""
    from preft_serve.adapters.format import AdapterType
    from preft_serve.toymodels import ReftSpec, make_reft_adapter

    adapter = make_reft_adapter(
        base_model_dir,
        tmp_path / "reft",
        0,
        ReftSpec(
            type=AdapterType(spec["type"]),
            positions=spec["positions"],
            share_weights=spec["share_weights"],
        ),
    )
    resp = upload(client, acme, "reft", adapter)
    assert resp.status_code == 201, resp.text
    assert resp.json()["type"] == spec["type"]


def test_reft_without_share_weights_key_is_shared(client, acme, base_model_dir, tmp_path):
    adapter = factories.reft(base_model_dir, tmp_path / "reft", "direft", share=True)
    factories.edit_config(adapter, share_weights=...)
    assert upload(client, acme, "reft", adapter).status_code == 201


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["lora", "loreft"])
def test_half_precision_accepted(kind, dtype, client, acme, lora_dir, base_model_dir, tmp_path):
    src = lora_dir if kind == "lora" else factories.reft(base_model_dir, tmp_path / "r")
    adapter = factories.cast(factories.copy_adapter(src, tmp_path / "half"), dtype)
    resp = upload(client, acme, "half", adapter)
    assert resp.status_code == 201, resp.text


def test_bf16_nan_found(client, acme, lora_dir, tmp_path, state_snapshot):
    import torch
    from safetensors.torch import load_file, save_file

    adapter = factories.cast(factories.copy_adapter(lora_dir, tmp_path / "half"), "bfloat16")
    tensors = load_file(str(adapter / WEIGHTS_FILE))
    name = max(tensors)
    tensors[name][-1, -1] = torch.inf
    save_file(tensors, str(adapter / WEIGHTS_FILE))
    before = state_snapshot()
    resp = upload(client, acme, "half", adapter)
    assert resp.status_code == 422
    assert error_message(resp) == f"tensor {name} contains NaN or Inf values; fix the training run"
    assert state_snapshot() == before
