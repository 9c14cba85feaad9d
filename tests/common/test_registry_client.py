"""RegistryClient / AsyncRegistryClient against a real Redis, with changes written by the
registry's own service code (so reader and writer agree on the layout)."""

from __future__ import annotations

import asyncio
import time

import pytest

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.common.registry_client import (
    AdapterRef,
    AsyncRegistryClient,
    EventType,
    KeyOwner,
    RegistryClient,
    RegistryEvent,
    ResolveCache,
)
from tests.support.registry_writer import eventually


@pytest.fixture
def client(redis_server: str, namespace: str):
    with RegistryClient(redis_server, namespace=namespace) as c:
        yield c


def test_resolve_user_and_adapter(client, writer):
    sha = writer.version("acme", "bot", "v1")
    writer.bindings.bind("acme", "alice", "bot")
    expected = AdapterRef("acme", "bot", 1, sha, AdapterType.LORA, AdapterMode.PREFILL, 8, "tiny")
    assert client.resolve_user("acme", "alice") == expected
    assert client.resolve_adapter("acme", "bot") == expected
    assert client.resolve_user("acme", "bob") is None
    assert client.resolve_user("other", "alice") is None  # tenant-scoped
    assert client.resolve_adapter("other", "bot") is None


def test_adapters_lists_current_versions_with_their_creation_time(
    client, writer, redis_server, namespace
):
    before = int(time.time())
    writer.version("acme", "bot", "v1")
    writer.version("acme", "ant", "a1")
    sha2 = writer.version("acme", "bot", "v2")  # a new version keeps the adapter's created
    writer.version("other", "zed", "z1")
    refs = client.adapters("acme")
    assert [(r.name, r.version) for r in refs] == [("ant", 1), ("bot", 2)]
    assert refs[1].sha256 == sha2
    assert all(before <= r.created <= time.time() for r in refs)
    assert client.resolve_adapter("acme", "bot").created == refs[1].created
    assert [r.name for r in client.adapters("acme", limit=1)] == ["ant"]
    assert client.adapters("nobody") == []

    async def listed() -> list[AdapterRef]:
        async with AsyncRegistryClient(redis_server, namespace=namespace) as aclient:
            return await aclient.adapters("acme")

    assert asyncio.run(listed()) == refs


def test_cache_serves_without_redis_and_events_invalidate(client, writer, redis_server, namespace):
    writer.version("acme", "bot", "v1")
    writer.version("acme", "bot2", "other")
    writer.bindings.bind("acme", "alice", "bot")
    # The listener applies the setup's events on its own thread; one applied after alice is
    # cached would drop her entry (a flake under a loaded full suite): wait until caught up.
    assert eventually(lambda: client.cursor == client.latest_cursor())
    assert client.resolve_user("acme", "alice").version == 1
    assert client.resolve_user("acme", "nobody") is None
    # Remove the binding behind the registry's back (no event): the cache still answers.
    writer.redis.delete(writer.keys.binding("acme", "alice"))
    assert client.resolve_user("acme", "alice").name == "bot"
    uncached = RegistryClient(redis_server, namespace=namespace, cache=False)
    assert uncached.resolve_user("acme", "alice") is None
    # A real change publishes an event, which invalidates exactly that entry.
    writer.bindings.bind("acme", "alice", "bot2")
    assert eventually(lambda: client.resolve_user("acme", "alice").name == "bot2")
    # Hot swap: a new version of the adapter reaches bound users.
    sha3 = writer.version("acme", "bot2", "v3")
    assert eventually(lambda: client.resolve_user("acme", "alice").sha256 == sha3)
    assert client.resolve_user("acme", "alice").version == 2
    # Negative entries are invalidated too.
    writer.bindings.bind("acme", "nobody", "bot")
    assert eventually(lambda: client.resolve_user("acme", "nobody") is not None)
    # Forced delete unbinds: users resolve to None (base model).
    writer.adapters.delete("acme", "bot2", force=True)
    assert eventually(lambda: client.resolve_user("acme", "alice") is None)
    assert client.resolve_adapter("acme", "bot2") is None


def test_listeners_and_cursor(client, writer):
    seen: list[RegistryEvent] = []
    client.add_listener(seen.append)
    writer.version("acme", "bot", "v1")
    writer.bindings.bind("acme", "u1", "bot")
    writer.bindings.unbind("acme", "u1")
    assert eventually(lambda: len(seen) == 3)
    assert [e.type for e in seen] == [
        EventType.ADAPTER_UPDATED,
        EventType.BINDING_UPDATED,
        EventType.BINDING_DELETED,
    ]
    assert seen[0].adapter == "bot" and seen[0].version == 1 and seen[0].sha256
    assert seen[1].user == "u1" and seen[1].adapter == "bot"
    assert client.cursor == seen[-1].id == client.latest_cursor()


def test_changes_since_pages_and_reports_trimming(client, writer):
    start = client.latest_cursor()
    for i in range(5):
        writer.version("acme", f"a{i}", f"c{i}")
    first = client.changes_since(start, limit=3)
    rest = client.changes_since(first.cursor, limit=3)
    assert [e.adapter for e in first.events + rest.events] == [f"a{i}" for i in range(5)]
    assert not first.reset and not rest.reset
    assert client.changes_since(rest.cursor).events == []
    assert client.changes_since(rest.cursor).cursor == rest.cursor
    everything = client.changes_since("0-0")
    assert len(everything.events) == 5 and not everything.reset
    # Events older than the stream keeps: a consumer that far behind must rebuild.
    writer.redis.xtrim(writer.keys.events, maxlen=2, approximate=False)
    assert client.changes_since(start).reset is True
    assert client.changes_since(first.cursor).reset is True
    assert client.changes_since(client.latest_cursor()).reset is False


def test_resume_from_saved_cursor_replays_missed_events(client, writer, redis_server, namespace):
    writer.version("acme", "bot", "v1")
    saved = eventually(lambda: client.cursor if client.cursor != "0-0" else None)
    writer.bindings.bind("acme", "u1", "bot")  # happens while a consumer is away
    writer.version("acme", "bot", "v2")
    replayed: list[RegistryEvent] = []
    later = RegistryClient(redis_server, namespace=namespace, cursor=saved)
    later.add_listener(replayed.append)
    with later:
        assert [e.type for e in replayed] == ["binding.updated", "adapter.updated"]
        assert later.cursor == replayed[-1].id


def test_reconnect_catches_up(client, writer):
    writer.version("acme", "bot", "v1")
    writer.version("acme", "bot2", "x")
    writer.bindings.bind("acme", "u1", "bot")
    assert client.resolve_user("acme", "u1").name == "bot"
    writer.redis.client_kill_filter(_type="pubsub")  # drop the listener's connection
    writer.bindings.bind("acme", "u1", "bot2")  # may be published while it is away
    assert eventually(lambda: client.live and client.resolve_user("acme", "u1").name == "bot2")


def test_not_live_means_no_cache(redis_server, writer, namespace):
    client = RegistryClient(redis_server, namespace=namespace)  # never started
    writer.version("acme", "bot", "v1")
    writer.bindings.bind("acme", "u1", "bot")
    assert not client.live
    assert client.resolve_user("acme", "u1").name == "bot"
    writer.redis.delete(writer.keys.binding("acme", "u1"))
    assert client.resolve_user("acme", "u1") is None


def test_blob_info(client, writer):
    sha = writer.version("acme", "bot", "v1", mode=AdapterMode.ALL)
    info = client.blob_info(sha)
    assert (info.type, info.mode, info.rank, info.base_model) == (
        AdapterType.LORA,
        AdapterMode.ALL,
        8,
        "tiny",
    )
    assert info.size_bytes == 10
    assert client.blob_info("0" * 64) is None


def test_cache_drops_writes_that_raced_an_event():
    cache = ResolveCache(max_entries=10)
    ref = AdapterRef("t", "a", 1, "s", AdapterType.LORA, AdapterMode.ALL, 1, "m")
    epoch = cache.epoch
    cache.apply(RegistryEvent("binding.updated", "t", user="u", adapter="a"))
    cache.put(epoch, "t", "u", "a", ref)  # read before the event: must not be stored
    assert cache.users == {}
    cache.put(cache.epoch, "t", "u", "a", ref)
    assert cache.get_user("t", "u") == ref
    for i in range(20):
        cache.put(cache.epoch, "t", f"user{i}", "a", ref)
    assert len(cache.users) == 10  # bounded


def test_async_client(redis_server, namespace, writer):
    async def scenario() -> None:
        async with AsyncRegistryClient(redis_server, namespace=namespace) as client:
            writer.version("acme", "bot", "v1")
            writer.bindings.bind("acme", "u1", "bot")
            ref = await client.resolve_user("acme", "u1")
            assert ref is not None and ref.version == 1
            assert (await client.resolve_adapter("acme", "bot")) == ref
            sha2 = writer.version("acme", "bot", "v2")
            for _ in range(500):
                ref = await client.resolve_user("acme", "u1")
                if ref.sha256 == sha2:
                    break
                await asyncio.sleep(0.01)
            assert ref.sha256 == sha2 and ref.version == 2
            batch = await client.changes_since("0-0")
            assert [e.version for e in batch.events if e.type == "adapter.updated"] == [1, 2]
            assert (await client.blob_info(sha2)).rank == 8
            assert client.cursor == await client.latest_cursor()

    asyncio.run(scenario())


def test_authenticate_caches_until_revoked(client, writer):
    _, first = writer.tenants.create("acme")
    second = writer.tenants.create_key("acme")
    assert client.authenticate(first.api_key) == KeyOwner("acme", first.key_id)
    assert client.authenticate(second.api_key) == KeyOwner("acme", second.key_id)
    assert client.authenticate(first.api_key + "x") is None
    assert client.authenticate("Bearer nonsense") is None
    writer.tenants.revoke_key("acme", first.key_id)
    assert eventually(lambda: client.authenticate(first.api_key) is None)
    assert client.authenticate(second.api_key) == KeyOwner("acme", second.key_id)


def test_async_authenticate(redis_server, namespace, writer):
    async def scenario() -> None:
        async with AsyncRegistryClient(redis_server, namespace=namespace) as client:
            _, key = writer.tenants.create("acme")
            assert await client.authenticate(key.api_key) == KeyOwner("acme", key.key_id)
            writer.tenants.revoke_key("acme", key.key_id)
            for _ in range(500):
                if await client.authenticate(key.api_key) is None:
                    break
                await asyncio.sleep(0.01)
            assert await client.authenticate(key.api_key) is None

    asyncio.run(scenario())
