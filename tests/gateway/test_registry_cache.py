"""The registry client's lookup caches stay small however many unknown users and adapter
names are asked for, and the gateway exports their sizes."""

from __future__ import annotations

import gc
import tracemalloc
import uuid

import httpx
from fastapi.testclient import TestClient

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.common.registry_client import AdapterRef, KeyOwner, RegistryClient
from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings
from tests.support.gateway import MSGS, Workers
from tests.support.registry_writer import Writer


def _id(tag: str, i: int, n: int) -> str:
    """A distinct ``n``-character string (each one a new object, as if read from Redis)."""
    return f"{tag}{i}".rjust(n, "x")


def test_default_cache_bound_holds_worst_case_entries_in_tens_of_mib() -> None:
    """21,000 rows of the largest entries: 256-character user ids and adapter names,
    negative and positive answers, API keys. Nothing connects to Redis."""
    client = RegistryClient("redis://127.0.0.1:9/0")
    cache = client._cache
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(21_000):
        tenant, name = _id("t", i, 64), _id("a", i, 256)
        cache.put(0, tenant, _id("u", i, 256), None, None)  # "user has no binding"
        cache.put(0, tenant, None, _id("n", i, 256), None)  # "no such adapter"
        cache.put(
            0,
            tenant,
            _id("b", i, 256),
            name,
            AdapterRef(
                tenant,
                name,
                10**6,
                _id("s", i, 64),
                AdapterType.LORA,
                AdapterMode.PREFILL,
                64,
                _id("m", i, 256),
            ),
        )
        cache.put_key(0, _id("k", i, 64), KeyOwner(_id("o", i, 64), _id("i", i, 32)))
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert (len(cache.users), len(cache.adapters), len(cache.api_keys)) == (20_000,) * 3
    assert used < 40 * 2**20, f"{used / 2**20:.1f} MiB"  # 1,000,000 per map: ~1.7 GiB


def test_gateway_caches_stay_at_their_bound_and_the_gauge_says_so(redis_server: str) -> None:
    namespace = f"gc{uuid.uuid4().hex[:8]}"
    _, key = Writer(redis_server, namespace).tenants.create("acme")
    settings = GatewaySettings(
        worker_urls=["http://w1:8000"],
        base_model_name="tiny",
        redis_url=redis_server,
        namespace=namespace,
        registry_cache_entries=50,
    )
    app = create_app(settings, transport=httpx.MockTransport(Workers()))
    auth = {"Authorization": f"Bearer {key.api_key}"}
    with TestClient(app, raise_server_exceptions=False) as client:
        for i in range(120):
            for field, value in (("user", f"ghost-{i}"), ("model", f"nothing-{i}")):
                resp = client.post(
                    "/v1/chat/completions", headers=auth, json={"messages": MSGS, field: value}
                )
                assert resp.status_code == 404, resp.text
        text = client.get("/metrics").text
        cache = app.state.gateway.registry._cache
        sizes = {
            "users": len(cache.users),
            "adapters": len(cache.adapters),
            "api_keys": len(cache.api_keys),
            "blobs": len(cache.blobs),
        }
    for name, entries in {"users": 50, "adapters": 50, "api_keys": 1, "blobs": 0}.items():
        assert f'preft_gateway_registry_cache_entries{{cache="{name}"}} {entries}.0' in text
    assert sizes == {"users": 50, "adapters": 50, "api_keys": 1, "blobs": 0}
