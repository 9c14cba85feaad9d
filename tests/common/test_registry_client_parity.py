"""The blocking and the asyncio registry clients run one scenario against the same real
Redis and must give the same answers at every stage: lookups, refused names, API keys,
blobs, the change feed, and their caches after events and after a reconnect."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from preft_serve.common.registry_client import (
    AsyncRegistryClient,
    RegistryClient,
    RegistryEvent,
)
from tests.support.registry_writer import Writer, eventually


class BlockingView:
    """An AsyncRegistryClient driven from this thread through its own event loop."""

    def __init__(self, client: AsyncRegistryClient) -> None:
        self.client = client
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr
        return lambda *args: self.run(attr(*args))

    def close(self) -> None:
        self.run(self.client.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def clients(redis_server: str, namespace: str) -> Iterator[dict[str, Any]]:
    sync_client = RegistryClient(redis_server, namespace=namespace).start()
    async_view = BlockingView(AsyncRegistryClient(redis_server, namespace=namespace))
    async_view.run(async_view.client.start())
    try:
        yield {"sync": sync_client, "async": async_view}
    finally:
        sync_client.close()
        async_view.close()


def _reads(client: Any, sha: str, api_key: str) -> dict[str, Any]:
    batch = client.changes_since("0-0")
    return {
        "user": client.resolve_user("acme", "u1"),
        "unbound": client.resolve_user("acme", "nobody"),
        "bad user": client.resolve_user("acme", "u1:x"),
        "adapter": client.resolve_adapter("acme", "bot"),
        "bad adapter": client.resolve_adapter("acme", "bot:users"),
        "bad tenant": client.resolve_adapter("ACME", "bot"),
        "key": client.authenticate(api_key),
        "unknown key": client.authenticate(api_key + "x"),
        "not a key": client.authenticate("Bearer x"),
        "blob": client.blob_info(sha),
        "no blob": client.blob_info("0" * 64),
        "bad blob": client.blob_info("abc"),
        "feed": [(e.type, e.tenant, e.adapter, e.user, e.version) for e in batch.events],
        "reset": batch.reset,
        "cursor is latest": client.cursor == client.latest_cursor() == batch.cursor,
        "live": client.live,
        "cache": client.cache_sizes(),
    }


def test_sync_and_async_clients_agree(clients: dict[str, Any], writer: Writer) -> None:
    seen: dict[str, list[RegistryEvent]] = {name: [] for name in clients}
    for name, client in clients.items():
        client.add_listener(seen[name].append)

    def stage(events: int) -> dict[str, Any]:
        assert eventually(lambda: all(len(s) == events for s in seen.values()))
        return {name: _reads(client, sha, key.api_key) for name, client in clients.items()}

    def agree(answers: dict[str, Any], check: Callable[[dict[str, Any]], bool]) -> None:
        assert answers["sync"] == answers["async"]
        assert check(answers["sync"]), answers["sync"]

    _, key = writer.tenants.create("acme")
    sha = writer.version("acme", "bot", "v1")
    writer.bindings.bind("acme", "u1", "bot")
    agree(
        stage(4),
        lambda a: (
            a["user"].version == 1
            and a["adapter"] == a["user"]
            and a["key"].key_id == key.key_id
            and a["blob"].sha256 == sha
            and a["unbound"] is a["bad user"] is a["bad adapter"] is a["no blob"] is None
            and a["cache"]["users"] == 2
            and not a["reset"]
            and a["cursor is latest"]
        ),
    )

    sha = writer.version("acme", "bot", "v2")
    writer.tenants.revoke_key("acme", key.key_id)
    agree(
        stage(6),
        lambda a: (
            a["user"].version == 2
            and a["user"].sha256 == sha
            and a["key"] is None
            and [f[0] for f in a["feed"]][-2:] == ["adapter.updated", "apikey.revoked"]
        ),
    )

    # Both listeners lose their connection; what changes meanwhile is caught up.
    writer.redis.client_kill_filter(_type="pubsub")
    writer.version("acme", "bot2", "x")
    writer.bindings.bind("acme", "u1", "bot2")
    assert eventually(lambda: all(c.live for c in clients.values()))
    agree(stage(8), lambda a: a["user"].name == "bot2" and a["live"])
    assert [e.id for e in seen["sync"]] == [e.id for e in seen["async"]]
