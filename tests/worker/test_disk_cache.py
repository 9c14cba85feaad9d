"""Disk LRU of adapter directories against a local-dir store and the moto S3 server."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from preft_serve.adapters.format import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    adapter_digest,
    canonical_config_bytes,
    directory_digest,
)
from preft_serve.common.objectstore import (
    BlobIntegrityError,
    ObjectNotFound,
    ObjectStore,
    adapter_key,
    create_object_store,
)
from preft_serve.worker.adapter_tiers.disk_cache import AdapterCacheMetrics, AdapterDiskCache

CREDS = {"region": "us-east-1", "access_key_id": "testing", "secret_access_key": "testing"}
BLOB = 4096  # weight bytes per test adapter


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path, s3_server: str) -> ObjectStore:
    if request.param == "local":
        return create_object_store(f"file://{tmp_path}/objects", create_root=True)
    return create_object_store(
        f"s3://cache-{uuid.uuid4().hex[:10]}/objs",
        endpoint_url=s3_server,
        create_bucket=True,
        **CREDS,
    )


@pytest.fixture
def local_store(tmp_path: Path) -> ObjectStore:
    return create_object_store(str(tmp_path / "objects"), create_root=True)


def put_adapter(store: ObjectStore, tmp_path: Path, seed: int, size: int = BLOB) -> str:
    """Upload a small adapter (JSON config + ``size`` bytes) and return its sha256."""
    config = canonical_config_bytes({"peft_type": "LORA", "r": 1, "seed": seed})
    weights = tmp_path / f"w{seed}.safetensors"
    weights.write_bytes(bytes([seed % 251]) * size)
    sha = adapter_digest(json.loads(config), weights.read_bytes())
    store.put_adapter(sha, config, weights)
    return sha


def new_cache(store: ObjectStore, cache_dir: Path, max_bytes: int = 1 << 30) -> AdapterDiskCache:
    return AdapterDiskCache(
        store, cache_dir, max_bytes, metrics=AdapterCacheMetrics(CollectorRegistry())
    )


def loads(cache: AdapterDiskCache, outcome: str) -> float:
    registry = cache.metrics.registry
    assert registry is not None
    value = registry.get_sample_value(
        "preft_worker_adapter_loads_total", {"tier": "disk", "outcome": outcome}
    )
    return value or 0.0


def counts(cache: AdapterDiskCache) -> dict[str, float]:
    """What the cache did so far, read from its Prometheus series (a download counts as a
    'miss' load; a failed load as 'not_found', 'corrupt' or 'error')."""
    registry = cache.metrics.registry
    assert registry is not None
    failures = sum(loads(cache, o) for o in ("not_found", "corrupt", "error"))
    return {
        "hits": loads(cache, "hit"),
        "downloads": loads(cache, "miss"),
        "failures": failures,
        "misses": loads(cache, "miss") + failures,
        "download_bytes": registry.get_sample_value("preft_worker_adapter_download_bytes_total")
        or 0.0,
        "evictions": registry.get_sample_value(
            "preft_worker_adapter_evictions_total", {"tier": "disk"}
        )
        or 0.0,
    }


class CountingStore:
    """Delegates to a real store, counting (and slowing) adapter fetches."""

    def __init__(self, inner: ObjectStore, delay: float = 0.0) -> None:
        self.inner = inner
        self.delay = delay
        self.fetches: list[str] = []
        self._lock = threading.Lock()

    def fetch_adapter(self, sha256: str, dest_dir: Path) -> Path:
        with self._lock:
            self.fetches.append(sha256)
        time.sleep(self.delay)
        return self.inner.fetch_adapter(sha256, dest_dir)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_miss_downloads_and_verifies_then_hits(store: ObjectStore, tmp_path: Path) -> None:
    sha = put_adapter(store, tmp_path, seed=1)
    cache = new_cache(store, tmp_path / "cache")

    path = cache.get(sha)

    assert path == tmp_path.resolve() / "cache" / sha
    assert sorted(p.name for p in path.iterdir()) == sorted([CONFIG_FILE, WEIGHTS_FILE])
    assert directory_digest(path) == sha
    assert (counts(cache)["hits"], counts(cache)["misses"], counts(cache)["downloads"]) == (0, 1, 1)
    assert counts(cache)["download_bytes"] == cache.total_bytes > BLOB

    assert cache.get(sha) == path
    assert (counts(cache)["hits"], counts(cache)["misses"], counts(cache)["downloads"]) == (1, 1, 1)
    assert (loads(cache, "hit"), loads(cache, "miss")) == (1.0, 1.0)
    registry = cache.metrics.registry
    assert registry is not None
    assert registry.get_sample_value("preft_worker_resident_adapters", {"tier": "disk"}) == 1
    assert (
        registry.get_sample_value("preft_worker_adapter_load_seconds_count", {"tier": "disk"}) == 2
    )
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [sha]  # no temp dirs left


def test_concurrent_requests_for_one_hash_download_once(store: ObjectStore, tmp_path: Path) -> None:
    sha = put_adapter(store, tmp_path, seed=2)
    counting = CountingStore(store, delay=0.3)
    cache = new_cache(counting, tmp_path / "cache")  # type: ignore[arg-type]

    with ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(lambda _: cache.get(sha), range(8)))

    assert counting.fetches == [sha]
    assert set(paths) == {tmp_path.resolve() / "cache" / sha}
    assert (counts(cache)["misses"], counts(cache)["hits"], counts(cache)["downloads"]) == (1, 7, 1)


def test_corrupt_blob_raises_and_caches_nothing(store: ObjectStore, tmp_path: Path) -> None:
    sha = put_adapter(store, tmp_path, seed=3)
    store.put_bytes(adapter_key(sha, WEIGHTS_FILE), b"bit rot" * 100)
    cache = new_cache(store, tmp_path / "cache")

    with pytest.raises(BlobIntegrityError, match=f"{sha}.*corrupt"):
        cache.get(sha)

    assert sha not in cache
    assert list((tmp_path / "cache").iterdir()) == []
    assert counts(cache)["failures"] == 1 and counts(cache)["downloads"] == 0
    assert loads(cache, "corrupt") == 1.0


def test_unknown_hash_raises_not_found_and_caches_nothing(
    local_store: ObjectStore, tmp_path: Path
) -> None:
    cache = new_cache(local_store, tmp_path / "cache")
    with pytest.raises(ObjectNotFound):
        cache.get("ab" * 32)
    assert list((tmp_path / "cache").iterdir()) == []
    assert loads(cache, "not_found") == 1.0


def test_invalid_hash_is_refused_before_the_store(tmp_path: Path) -> None:
    counting = CountingStore(create_object_store(str(tmp_path / "objects"), create_root=True))
    cache = new_cache(counting, tmp_path / "cache")  # type: ignore[arg-type]
    for bad in ("AB" * 32, "ab" * 31, "../" + "ab" * 31, ""):
        with pytest.raises(ValueError):
            cache.get(bad)
    assert counting.fetches == []


def test_evicts_least_recently_used_beyond_max_bytes(
    local_store: ObjectStore, tmp_path: Path
) -> None:
    a, b, c = (put_adapter(local_store, tmp_path, seed=s) for s in (10, 11, 12))
    cache = new_cache(local_store, tmp_path / "cache", max_bytes=1 << 30)
    cache.get(a)
    one = cache.total_bytes
    cache.max_bytes = int(2.5 * one)  # room for two
    cache.get(b)
    cache.get(a)  # a is now the most recently used
    cache.get(c)

    assert cache.lru_order() == [a, c]
    assert not (tmp_path / "cache" / b).exists()
    assert counts(cache)["evictions"] == 1 and cache.total_bytes == 2 * one
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([a, c])

    cache.get(b)  # a miss again, and now a is the oldest
    assert cache.lru_order() == [c, b]
    assert counts(cache)["downloads"] == 4


def test_entry_in_use_is_never_evicted_even_over_budget(
    local_store: ObjectStore, tmp_path: Path
) -> None:
    a, b = (put_adapter(local_store, tmp_path, seed=s) for s in (20, 21))
    cache = new_cache(local_store, tmp_path / "cache", max_bytes=1 << 20)
    cache.max_bytes = 1  # smaller than any adapter

    path_a = cache.get(a)
    assert directory_digest(path_a) == a  # the load that needed it got it whole
    path_b = cache.get(b)
    assert cache.lru_order() == [b] and not path_a.exists() and path_b.exists()


def test_restart_rebuilds_index_in_lru_order_and_removes_leftovers(
    local_store: ObjectStore, tmp_path: Path
) -> None:
    shas = [put_adapter(local_store, tmp_path, seed=s) for s in (30, 31, 32)]
    cache_dir = tmp_path / "cache"
    first = new_cache(local_store, cache_dir)
    for sha in (*shas, shas[0]):  # order of use: 31, 32, 30
        first.get(sha)
        time.sleep(0.02)  # file timestamps are coarse
    expected = [shas[1], shas[2], shas[0]]
    # What a crash leaves behind: a half download, a half eviction, a stray incomplete dir.
    (cache_dir / f".tmp-{shas[1]}-dead").mkdir()
    (cache_dir / f".tmp-{shas[1]}-dead" / WEIGHTS_FILE).write_bytes(b"partial")
    (cache_dir / ".evict-x").mkdir()
    (cache_dir / ("cd" * 32)).mkdir()

    counting = CountingStore(local_store)
    second = new_cache(counting, cache_dir)  # type: ignore[arg-type]

    assert second.lru_order() == expected
    assert second.total_bytes == first.total_bytes
    assert sorted(os.listdir(cache_dir)) == sorted(shas)
    second.get(shas[1])
    assert counting.fetches == [] and counts(second)["hits"] == 1

    smaller = new_cache(local_store, cache_dir, max_bytes=first.total_bytes // 3 + 1)
    assert smaller.lru_order() == [shas[1]]  # the one just used survives, the rest evicted


def test_a_used_adapter_stays_young_and_a_missing_one_is_reported(
    local_store: ObjectStore, tmp_path: Path
) -> None:
    """Requests for adapters vLLM's server already holds never reach ``get``:
    ``note_use`` keeps them young in the LRU (so the hot ones are not evicted first) and
    says when one is gone (evicted, or its directory removed), so it is fetched again."""
    a, b, c = (put_adapter(local_store, tmp_path, seed=s) for s in (20, 21, 22))
    cache = new_cache(local_store, tmp_path / "cache")
    cache.get(a)
    one = cache.total_bytes
    cache.max_bytes = int(2.5 * one)
    cache.get(b)
    assert cache.note_use(a)  # a is in use: b becomes the oldest
    cache.get(c)
    assert cache.lru_order() == [a, c]
    assert not cache.note_use(b)  # evicted: the caller fetches it again
    shutil.rmtree(tmp_path / "cache" / c)  # removed behind the cache's back
    assert not cache.note_use(c) and c not in cache
    assert cache.total_bytes == one
    cache.get(c)
    assert (tmp_path / "cache" / c).is_dir() and counts(cache)["downloads"] == 4
