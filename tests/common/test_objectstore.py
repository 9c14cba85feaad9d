"""Local and S3 (moto over HTTP) stores behave the same behind one interface."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from preft_serve.adapters.format import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    adapter_digest,
    canonical_config_bytes,
)
from preft_serve.common.objectstore import (
    BlobIntegrityError,
    LocalObjectStore,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreKind,
    ObjectStoreSettings,
    S3ObjectStore,
    StoreUnavailable,
    adapter_key,
    create_object_store,
    parse_store_url,
)

CREDS = {"region": "us-east-1", "access_key_id": "testing", "secret_access_key": "testing"}


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path, s3_server) -> ObjectStore:
    if request.param == "local":
        return create_object_store(f"file://{tmp_path}/objects", create_root=True)
    bucket = f"os-{uuid.uuid4().hex[:10]}"
    return create_object_store(
        f"s3://{bucket}/some/prefix", endpoint_url=s3_server, create_bucket=True, **CREDS
    )


@pytest.fixture
def adapter(tmp_path) -> tuple[str, bytes, Path]:
    config = canonical_config_bytes({"peft_type": "LORA", "r": 1, "preft_mode": "prefill"})
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"weights" * 1000)
    return adapter_digest(json.loads(config), weights.read_bytes()), config, weights


def test_basic_operations(store, tmp_path):
    store.check()
    assert not store.exists("a/b")
    store.put_bytes("a/b", b"hello")
    src = tmp_path / "src"
    src.write_bytes(b"x" * 100_000)
    store.put_file("a/c", src)
    assert store.exists("a/b") and store.get_bytes("a/b") == b"hello"
    store.download_file("a/c", tmp_path / "dst")
    assert (tmp_path / "dst").read_bytes() == src.read_bytes()
    assert sorted(store.list_keys("a/")) == ["a/b", "a/c"]
    assert list(store.list_keys("zzz")) == []
    store.delete("a/b")
    store.delete("a/b")  # missing is fine
    assert not store.exists("a/b")
    with pytest.raises(ObjectNotFound):
        store.get_bytes("a/b")
    with pytest.raises(ObjectNotFound):
        store.download_file("nope", tmp_path / "nope")


def test_adapter_layout_roundtrip(store, adapter, tmp_path):
    digest, config, weights = adapter
    assert not store.has_adapter(digest)
    assert store.put_adapter(digest, config, weights) is True
    assert store.put_adapter(digest, config, weights) is False  # idempotent
    assert store.exists(f"adapters/{digest}/{CONFIG_FILE}")
    assert store.exists(f"adapters/{digest}/{WEIGHTS_FILE}")
    assert list(store.list_adapters()) == [digest]
    out = store.fetch_adapter(digest, tmp_path / "fetched")
    assert (out / CONFIG_FILE).read_bytes() == config
    assert (out / WEIGHTS_FILE).read_bytes() == weights.read_bytes()
    store.delete_adapter(digest)
    assert not store.has_adapter(digest)


def test_put_adapter_refuses_wrong_digest(store, adapter):
    _, config, weights = adapter
    with pytest.raises(BlobIntegrityError, match="content hashes to"):
        store.put_adapter("0" * 64, config, weights)
    assert list(store.list_keys("")) == []


def test_fetch_detects_corruption(store, adapter, tmp_path):
    digest, config, weights = adapter
    store.put_adapter(digest, config, weights)
    store.put_bytes(adapter_key(digest, WEIGHTS_FILE), b"tampered")
    dest = tmp_path / "fetched"
    with pytest.raises(BlobIntegrityError, match="the stored blob is corrupt"):
        store.fetch_adapter(digest, dest)
    assert not (dest / WEIGHTS_FILE).exists() and not (dest / CONFIG_FILE).exists()


def test_half_written_adapter_reads_as_absent(store, adapter):
    digest, config, weights = adapter
    store.put_file(adapter_key(digest, WEIGHTS_FILE), weights)  # crash before the config
    assert not store.has_adapter(digest)
    assert list(store.list_adapters()) == []
    assert store.put_adapter(digest, config, weights) is True


def test_factory_by_url_and_kind(tmp_path, s3_server):
    assert parse_store_url("/var/x") == (ObjectStoreKind.LOCAL, "/var/x")
    assert parse_store_url("rel/dir") == (ObjectStoreKind.LOCAL, "rel/dir")
    assert parse_store_url("file:///var/x") == (ObjectStoreKind.LOCAL, "/var/x")
    assert parse_store_url("s3://b/p/q") == (ObjectStoreKind.S3, "b/p/q")
    assert isinstance(create_object_store(str(tmp_path)), LocalObjectStore)
    s3 = ObjectStoreSettings(
        url="s3://f-bucket/p",
        s3_endpoint_url=s3_server,
        s3_region="us-east-1",
        s3_access_key_id="testing",
        s3_secret_access_key="testing",
        s3_create_bucket=True,
    ).create()
    assert isinstance(s3, S3ObjectStore) and s3.prefix == "p/"
    with pytest.raises(
        ValueError,
        match=r"unknown object store 'gs' in 'gs://x'; valid: local "
        r"\(a path or file:///path\), s3 \(s3://bucket",
    ):
        create_object_store("gs://x")
    with pytest.raises(ValueError, match="needs a bucket"):
        create_object_store("s3")


def test_invalid_keys_rejected(tmp_path):
    store = LocalObjectStore(tmp_path)
    for key in ("../escape", "/abs", "a//b", "a/./b", ""):
        with pytest.raises(ValueError, match="invalid object key"):
            store.put_bytes(key, b"x")
    with pytest.raises(ValueError, match="not a lowercase hex sha256"):
        adapter_key("ABC", CONFIG_FILE)


def test_s3_unreachable_is_an_object_store_error(tmp_path):
    from tests.support.ports import free_port

    store = S3ObjectStore("b", endpoint_url=f"http://127.0.0.1:{free_port()}", **CREDS)
    store._client.meta.config.retries = {"max_attempts": 1}
    with pytest.raises(StoreUnavailable, match="not reachable"):
        store.check()


# -- outages: a store that cannot be used is unavailable, never "not found" ---------------


def _break(root: Path, how: str) -> None:
    root.rename(root.with_name("moved"))  # the volume was moved or unmounted
    if how == "replaced by a file":
        root.write_bytes(b"")


@pytest.mark.parametrize("how", ["moved", "replaced by a file"])
def test_local_store_outage_is_unavailable_and_never_recreated(tmp_path, adapter, how):
    sha, config, weights = adapter
    root = tmp_path / "objects"
    store = LocalObjectStore(root, create=True)
    store.put_bytes("kept", b"x")
    _break(root, how)

    calls = {
        "put_adapter": lambda: store.put_adapter(sha, config, weights),
        "put_bytes": lambda: store.put_bytes("a/b", b"x"),
        "get_bytes": lambda: store.get_bytes("kept"),
        "download_file": lambda: store.download_file("kept", tmp_path / "out"),
        "exists": lambda: store.exists("kept"),
        "has_adapter": lambda: store.has_adapter(sha),
        "delete": lambda: store.delete("kept"),
        "list_keys": lambda: list(store.list_keys()),
        "fetch_adapter": lambda: store.fetch_adapter(sha, tmp_path / "fetched"),
        "check": store.check,
    }
    for name, call in calls.items():
        with pytest.raises(StoreUnavailable) as info:
            call()
        assert not isinstance(info.value, ObjectNotFound), name
        reason = info.value.reason
        assert str(tmp_path) not in reason and "Errno" not in reason, (name, reason)
    assert root.is_file() if how == "replaced by a file" else not root.exists()
    assert sorted(p.name for p in (tmp_path / "moved").iterdir()) == ["kept"]


def test_local_store_is_created_only_when_asked(tmp_path):
    store = create_object_store(str(tmp_path / "objects"))
    assert not (tmp_path / "objects").exists()
    with pytest.raises(StoreUnavailable, match="directory is missing"):
        store.put_bytes("k", b"x")
    assert not (tmp_path / "objects").exists()
    create_object_store(str(tmp_path / "objects"), create_root=True).put_bytes("k", b"x")
    assert store.get_bytes("k") == b"x"
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StoreUnavailable, match="not a directory"):
        LocalObjectStore(tmp_path / "file", create=True)


def test_local_missing_key_under_a_healthy_root_is_not_found(tmp_path):
    store = LocalObjectStore(tmp_path)
    store.put_bytes("adapters/x", b"x")
    for key in ("nope", "adapters/y", "adapters/x/deeper", "adapters"):
        with pytest.raises(ObjectNotFound):
            store.get_bytes(key)
        assert not store.exists(key)
    store.delete("nope")  # a missing key is not an error


def test_s3_missing_bucket_is_unavailable_not_not_found(s3_server, adapter):
    sha, config, weights = adapter
    store = S3ObjectStore(f"gone-{uuid.uuid4().hex[:10]}", endpoint_url=s3_server, **CREDS)
    for call in (
        lambda: store.get_bytes(adapter_key(sha, CONFIG_FILE)),
        lambda: store.put_adapter(sha, config, weights),
        lambda: list(store.list_keys()),
        store.check,
    ):
        with pytest.raises(StoreUnavailable, match="bucket does not exist") as info:
            call()
        assert not isinstance(info.value, ObjectNotFound)
        assert info.value.reason == "the object store bucket does not exist"
