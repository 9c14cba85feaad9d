"""Registry events prefetch new versions into a worker's disk cache (real Redis, registry
app, local object store)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from preft_serve.adapters.format import AdapterMode
from preft_serve.common.objectstore import ObjectStoreSettings, create_object_store
from preft_serve.common.registry_client import RegistryClient
from preft_serve.registry.app import create_app
from preft_serve.registry.settings import RegistrySettings
from preft_serve.toymodels import LoraSpec, make_lora_adapter, make_model
from preft_serve.worker.adapter_tiers.disk_cache import AdapterDiskCache
from preft_serve.worker.adapter_tiers.hot_swap_prefetch import PrefetchMetrics, RegistryPrefetcher

ADMIN = "prefetch-admin-0123456789abcdef"


def _files(adapter: Path) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [
        ("files", (p.name, p.read_bytes(), "application/octet-stream"))
        for p in sorted(adapter.iterdir())
        if p.is_file()
    ]


def _wait_for(condition: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_new_version_of_a_held_adapter_is_prefetched_and_the_old_demoted(
    tmp_path: Path, redis_server: str
) -> None:
    model = make_model("tiny-llama", tmp_path / "model")
    spec = LoraSpec(rank=4, mode=AdapterMode.PREFILL)
    v1, v2, other = (
        make_lora_adapter(model, tmp_path / f"a{i}", seed=i, spec=spec) for i in (1, 2, 3)
    )
    objects, namespace = tmp_path / "objects", f"p{uuid.uuid4().hex[:8]}"
    settings = RegistrySettings(
        admin_token=ADMIN,
        redis_url=redis_server,
        namespace=namespace,
        base_model=model,
        staging_dir=tmp_path,
        object_store=ObjectStoreSettings(url=str(objects)),
    )
    store = create_object_store(str(objects), create_root=True)
    holder = AdapterDiskCache(store, tmp_path / "holder", 1 << 30)
    bystander = AdapterDiskCache(store, tmp_path / "bystander", 1 << 30)
    clients = [RegistryClient(redis_server, namespace=namespace) for _ in range(2)]
    metrics = [PrefetchMetrics(CollectorRegistry()) for _ in range(2)]
    prefetchers = [
        RegistryPrefetcher(c, cache, m)
        for c, cache, m in zip(clients, (holder, bystander), metrics, strict=True)
    ]
    for client in clients:
        client.start()
    try:
        with TestClient(create_app(settings)) as registry:
            key = registry.post(
                "/v1/tenants", json={"name": "acme"}, headers={"Authorization": f"Bearer {ADMIN}"}
            ).json()["api_key"]
            auth = {"Authorization": f"Bearer {key}"}
            first = registry.post(
                "/v1/adapters",
                data={"name": "bot", "mode": "prefill"},
                files=_files(v1),
                headers=auth,
            )
            unrelated = registry.post(
                "/v1/adapters",
                data={"name": "x", "mode": "prefill"},
                files=_files(other),
                headers=auth,
            )
            assert first.status_code == unrelated.status_code == 201
            sha1, sha_other = first.json()["sha256"], unrelated.json()["sha256"]
            holder.get(sha1)  # this worker served bot v1 ...
            holder.get(sha_other)  # ... and, more recently, another adapter
            assert holder.lru_order() == [sha1, sha_other]

            second = registry.put(  # the hot swap: served at once, so its event prefetches
                "/v1/adapters/bot",
                params={"promote": "true"},
                data={"mode": "prefill"},
                files=_files(v2),
                headers=auth,
            )
            assert second.status_code == 201, second.text
            sha2 = second.json()["sha256"]

        assert _wait_for(lambda: sha2 in holder)
        assert holder.lru_order() == [sha1, sha_other, sha2]  # v1 is next to be evicted
        assert (holder.path(sha2) / "adapter_config.json").is_file()
        assert _wait_for(lambda: metrics[1].prefetches.labels("skipped")._value.get() == 1)
        assert sha2 not in bystander and bystander.lru_order() == []
        assert metrics[0].prefetches.labels("fetched")._value.get() == 1
        assert metrics[0].prefetches.labels("skipped")._value.get() == 0
    finally:
        for prefetcher, client in zip(prefetchers, clients, strict=True):
            prefetcher.close()
            client.close()


def test_demote_of_an_unknown_hash_is_a_no_op(tmp_path: Path) -> None:
    store = create_object_store(str(tmp_path / "o"), create_root=True)
    cache = AdapterDiskCache(store, tmp_path / "c", 1 << 20)
    cache.demote("ab" * 32)
    assert cache.lru_order() == []
