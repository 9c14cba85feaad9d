"""Registry clients through a Redis crash: cached answers keep coming (stale-if-error),
lookups never cached fail loudly, and the event listener catches up after the restart.

Uses a redis-server of its own (append-only, fsync always) so it can be killed and
restarted on the same port with the same data.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from preft_serve.common.registry_client import AsyncRegistryClient, KeyOwner, RegistryClient, cache
from tests.support.redis_process import RedisProcess
from tests.support.registry_writer import Writer, eventually


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()


def test_sync_client_serves_cache_while_redis_is_down_and_catches_up(
    own_redis: RedisProcess,
) -> None:
    writer = Writer(own_redis.url, "outage")
    sha = writer.version("acme", "bot", "v1")
    writer.version("acme", "bot2", "v2")
    _, key = writer.tenants.create("acme")
    writer.bindings.bind("acme", "alice", "bot")
    writer.bindings.bind("acme", "bob", "bot")
    with RegistryClient(own_redis.url, namespace="outage") as client:
        assert client.resolve_user("acme", "alice").sha256 == sha
        assert client.resolve_user("acme", "carol") is None  # cached as "no binding"
        assert client.authenticate(key.api_key) == KeyOwner("acme", key.key_id)
        uncached = RegistryClient(own_redis.url, namespace="outage", cache=False)

        own_redis.kill()
        assert eventually(lambda: not client.live)
        assert client.resolve_user("acme", "alice").sha256 == sha
        assert client.resolve_adapter("acme", "bot").sha256 == sha
        assert client.resolve_user("acme", "carol") is None
        assert client.authenticate(key.api_key) == KeyOwner("acme", key.key_id)
        with pytest.raises(redis.ConnectionError):
            client.resolve_user("acme", "bob")  # bound, but never looked up
        with pytest.raises(redis.ConnectionError):
            client.resolve_adapter("acme", "bot2")
        with pytest.raises(redis.ConnectionError):
            uncached.resolve_user("acme", "alice")  # no cache, no fallback

        own_redis.start()
        assert eventually(lambda: client.live, timeout=15)
        assert client.resolve_user("acme", "bob").name == "bot"
        writer.bindings.bind("acme", "alice", "bot2")  # invalidates the cached entry
        assert eventually(lambda: client.resolve_user("acme", "alice").name == "bot2")
        uncached.close()


def test_async_client_serves_cache_while_redis_is_down(own_redis: RedisProcess) -> None:
    writer = Writer(own_redis.url, "outage")
    sha = writer.version("acme", "bot", "v1")
    writer.bindings.bind("acme", "alice", "bot")
    writer.bindings.bind("acme", "bob", "bot")

    async def scenario() -> None:
        async with AsyncRegistryClient(own_redis.url, namespace="outage") as client:
            assert (await client.resolve_user("acme", "alice")).sha256 == sha
            own_redis.kill()
            deadline = time.monotonic() + 5
            while client.live and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert not client.live
            assert (await client.resolve_user("acme", "alice")).sha256 == sha
            assert (await client.resolve_adapter("acme", "bot")).sha256 == sha
            with pytest.raises(redis.ConnectionError):
                await client.resolve_user("acme", "bob")
            own_redis.start()
            while not client.live and time.monotonic() < deadline + 15:
                await asyncio.sleep(0.05)
            assert client.live
            writer.bindings.unbind("acme", "alice")
            for _ in range(500):
                if await client.resolve_user("acme", "alice") is None:
                    break
                await asyncio.sleep(0.01)
            assert await client.resolve_user("acme", "alice") is None

    asyncio.run(scenario())


def test_redis_back_without_its_data_drops_the_whole_cache(
    own_redis: RedisProcess, tmp_path: Path
) -> None:
    """A Redis that restarts empty (no persistence, or a lost volume) must not leave the
    client serving bindings and API keys that no longer exist anywhere."""
    writer = Writer(own_redis.url, "outage")
    writer.version("acme", "bot", "v1")
    _, key = writer.tenants.create("acme")
    writer.bindings.bind("acme", "alice", "bot")
    with RegistryClient(own_redis.url, namespace="outage") as client:
        assert eventually(lambda: client.cursor not in (None, "0-0"))
        assert client.resolve_user("acme", "alice").name == "bot"
        assert client.authenticate(key.api_key) is not None
        own_redis.kill()
        own_redis.wipe()
        own_redis.start()
        assert eventually(
            lambda: client.live and client.authenticate(key.api_key) is None, timeout=15
        )
        assert client.resolve_user("acme", "alice") is None
        # Life goes on with the new (empty) data set: new changes arrive as events.
        writer.version("acme", "bot", "v1")
        writer.bindings.bind("acme", "alice", "bot")
        assert eventually(lambda: client.resolve_user("acme", "alice") is not None)


def test_changes_since_reports_a_reset_when_the_stream_is_gone_or_behind(
    own_redis: RedisProcess,
) -> None:
    writer = Writer(own_redis.url, "outage")
    client = RegistryClient(own_redis.url, namespace="outage")
    assert client.changes_since("0-0").reset is False  # nothing ever happened: fine
    writer.version("acme", "bot", "v1")
    seen = client.latest_cursor()
    assert client.changes_since(seen).reset is False
    writer.redis.delete(writer.keys.events)
    assert client.changes_since(seen).reset is True  # the stream vanished
    writer.redis.xadd(writer.keys.events, {"type": "x"}, id="1-1")
    assert client.changes_since(seen).reset is True  # a stream older than what we saw
    assert client.changes_since("1-1").reset is False


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_listener_backs_off_and_logs_only_down_and_up(
    own_redis: RedisProcess,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    flavour: str,
) -> None:
    """While Redis is down the listener retries after 0.5 s, 1 s, 2 s ... up to 5 s (scaled
    down 10x here) and logs one warning, not one every attempt; one line when it is back."""
    monkeypatch.setattr(cache, "LISTENER_RETRY_FIRST_S", 0.05, raising=False)
    monkeypatch.setattr(cache, "LISTENER_RETRY_MAX_S", 0.5, raising=False)
    caplog.set_level(logging.DEBUG, logger="preft_serve.common.registry_client")

    def outage(live: Callable[[], bool]) -> None:
        own_redis.kill()
        time.sleep(2.5)
        own_redis.start()
        assert eventually(live, timeout=5)

    if flavour == "sync":
        with RegistryClient(own_redis.url, namespace="outage") as client:
            outage(lambda: client.live)
    else:

        async def scenario() -> None:
            async with AsyncRegistryClient(own_redis.url, namespace="outage") as client:
                await asyncio.to_thread(outage, lambda: client.live)

        asyncio.run(scenario())
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "listener" in r.getMessage()]
    assert [level for level, _ in lines if level != "DEBUG"] == ["WARNING", "INFO"], lines
    assert lines[0][1].startswith("registry event listener lost Redis (")
    assert lines[-1][1] == "registry event listener reconnected to Redis and caught up"
    waits = [float(m.rsplit(" ", 2)[-2]) for level, m in lines if level == "DEBUG"]
    assert waits[:4] == [0.05, 0.1, 0.2, 0.4]  # 2.5 s down: 8 or so attempts, not 50
    assert waits[4:] == [0.5] * (len(waits) - 4) and len(waits) > 4
