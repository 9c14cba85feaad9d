"""Concurrent uploads of one name over real HTTP give consecutive versions with no loss."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from preft_serve.common.registry_client import RegistryClient
from tests.registry import factories
from tests.support.registry_api import admin, bearer

WRITERS = 8


@pytest.fixture
def settings(settings):
    """Every writer at once: one tenant's uploads race each other, so its share of the
    transfer slots (2 by default) is raised to let them all in."""
    return settings.model_copy(update={"max_transfers": WRITERS, "tenant_max_transfers": WRITERS})


def _variants(src: Path, tmp: Path, n: int) -> list[Path]:
    out = []
    for i in range(n):
        d = factories.copy_adapter(src, tmp / f"v{i}")
        factories.edit_tensors(
            d, lambda t, i=i: {k: (v * (1 + 0.01 * (i + 1))).astype(v.dtype) for k, v in t.items()}
        )
        out.append(d)
    return out


def _files(d: Path) -> list:
    return [("files", (p.name, p.read_bytes())) for p in sorted(d.iterdir())]


def test_concurrent_puts_give_consecutive_versions(
    live_server, lora_dir, tmp_path, redis_server, namespace
):
    key = httpx.post(f"{live_server}/v1/tenants", json={"name": "acme"}, headers=admin()).json()[
        "api_key"
    ]
    variants = _variants(lora_dir, tmp_path, WRITERS)
    barrier = threading.Barrier(WRITERS)
    results: list[dict] = []
    errors: list[str] = []

    def put(d: Path) -> None:
        with httpx.Client(base_url=live_server, headers=bearer(key), timeout=60) as http:
            files = _files(d)
            barrier.wait()
            resp = http.put(
                "/v1/adapters/bot",
                params={"promote": "true"},
                data={"mode": "prefill"},
                files=files,
            )
            (results if resp.status_code == 201 else errors).append(
                resp.json() if resp.status_code == 201 else resp.text
            )

    threads = [threading.Thread(target=put, args=(d,)) for d in variants]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(r["version"] for r in results) == list(range(1, WRITERS + 1))
    assert len({r["sha256"] for r in results}) == WRITERS
    detail = httpx.get(f"{live_server}/v1/adapters/bot", headers=bearer(key)).json()
    history = {v["version"]: v["sha256"] for v in detail["versions"]}
    assert history == {r["version"]: r["sha256"] for r in results}
    assert detail["version"] == WRITERS
    # one event per version, in version order
    changes = RegistryClient(redis_server, namespace=namespace).changes_since("0-0")
    updates = [e for e in changes.events if e.type == "adapter.updated"]
    assert [e.version for e in updates] == list(range(1, WRITERS + 1))
    assert [e.sha256 for e in updates] == [history[v] for v in range(1, WRITERS + 1)]


def test_concurrent_identical_posts_create_one_version(live_server, lora_dir):
    key = httpx.post(f"{live_server}/v1/tenants", json={"name": "acme"}, headers=admin()).json()[
        "api_key"
    ]
    barrier = threading.Barrier(4)
    statuses: list[int] = []

    def post() -> None:
        with httpx.Client(base_url=live_server, headers=bearer(key), timeout=60) as http:
            files = _files(lora_dir)
            barrier.wait()
            resp = http.post("/v1/adapters", data={"name": "bot", "mode": "prefill"}, files=files)
            statuses.append(resp.status_code)

    threads = [threading.Thread(target=post) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [200, 200, 200, 201]
    detail = httpx.get(f"{live_server}/v1/adapters/bot", headers=bearer(key)).json()
    assert [v["version"] for v in detail["versions"]] == [1]
