"""Redis crashes and comes back: the gateway keeps serving what it has cached and recovers.

This module runs its own redis-server (append-only file, fsync always) so it can SIGKILL
it and restart it on the same port with the same data; the registry and the gateway are
real processes on it, the package's worker serves the adapters.

While Redis is down a user the gateway has already served (API key, binding and adapter
cached) still gets answers; anything the gateway has never looked up gets a clear 503.
After the restart the gateway's event listener reconnects: a user bound before the crash
but never seen is served, and bindings changed after the restart reach even cached users.
If Redis comes back without its data, the gateway drops its cache: the tenant's key no
longer exists, so it is refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from preft_serve.adapters.format import AdapterMode
from preft_serve.toymodels import LoraSpec, make_lora_adapter
from tests.e2e.stack import (
    Base,
    Registry,
    complete,
    running_gateway,
    running_registry,
    token_ids,
    worker_tokens,
)
from tests.support.processes import ServiceProcess
from tests.support.redis_process import RedisProcess

RECOVERY_TIMEOUT_S = 30


@dataclass
class OutageStack:
    redis: RedisProcess
    registry: Registry
    gateway: ServiceProcess
    api_key: str
    expected: dict[str, list[int]]  # adapter name -> its tokens, from the worker directly


@pytest.fixture(scope="module")
def stack(base: Base, worker: ServiceProcess) -> Iterator[OutageStack]:
    root = base.root / "redis-restart"
    root.mkdir()
    own = RedisProcess(root).start()
    try:
        with (
            running_registry(root, own.url, "outage", base.model, base.objects) as registry,
            running_gateway(root, own.url, "outage", base.model, [worker.url]) as gateway,
        ):
            key = registry.create_tenant("outage")
            expected = {}
            for seed, name in ((51, "bot"), (52, "bot2")):
                folder = make_lora_adapter(
                    base.model,
                    root / name,
                    seed=seed,
                    spec=LoraSpec(rank=8, mode=AdapterMode.PREFILL),
                )
                sha = registry.upload(key, name, folder, "prefill")["sha256"]
                expected[name] = worker_tokens(worker.url, sha)
            assert expected["bot"] != expected["bot2"]
            registry.bind(key, "u1", "bot")
            registry.bind(key, "u2", "bot")  # bound, but the gateway never sees u2 before
            yield OutageStack(own, registry, gateway, key, expected)
    finally:
        own.stop()


def _eventually(check, timeout: float = RECOVERY_TIMEOUT_S):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            if value := check():
                return value
        except (httpx.HTTPError, AssertionError):
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            return check()
        time.sleep(0.2)


def test_cached_users_survive_a_redis_crash_and_the_gateway_recovers(
    stack: OutageStack,
) -> None:
    url, key, expected = stack.gateway.url, stack.api_key, stack.expected
    assert token_ids(complete(url, api_key=key, user="u1")) == expected["bot"]

    stack.redis.kill()
    assert not stack.redis.ping()
    # Right after the crash, and once the gateway's event listener has noticed it.
    for pause in (0.0, 1.5):
        time.sleep(pause)
        assert token_ids(complete(url, api_key=key, user="u1")) == expected["bot"]
        never_seen = complete(url, api_key=key, user="u2")
        assert never_seen.status_code == 503, never_seen.text
        error = never_seen.json()["error"]
        assert error["code"] == "service_unavailable" and "Redis" in error["message"]
        never_resolved = complete(url, api_key=key, model="bot2")
        assert never_resolved.status_code == 503, never_resolved.text
    assert httpx.get(f"{url}/readyz", timeout=10).status_code == 503

    stack.redis.start()  # same port, same append-only file: all data is back
    assert _eventually(lambda: httpx.get(f"{url}/readyz", timeout=10).status_code == 200)
    assert token_ids(complete(url, api_key=key, user="u2")) == expected["bot"]

    # A change after the restart reaches a user the gateway had cached (events reconnect)...
    _bind(stack.registry, key, "u1", "bot2")
    assert _eventually(lambda: token_ids(complete(url, api_key=key, user="u1")) == expected["bot2"])
    # ...and a brand-new binding is served.
    _bind(stack.registry, key, "u3", "bot2")
    assert token_ids(complete(url, api_key=key, user="u3")) == expected["bot2"]


def _bind(registry: Registry, key: str, user: str, adapter: str) -> None:
    """Bind, allowing the registry a moment to reconnect to the restarted Redis (503)."""
    reply = _eventually(
        lambda: (
            registry.bind_reply(key, user, adapter).status_code != 503
            and registry.bind_reply(key, user, adapter)
        )
    )
    assert reply.status_code == 200, reply.text


def test_redis_back_empty_means_nothing_cached_is_served(stack: OutageStack) -> None:
    """Redis restarted without its data (a lost volume): the tenant, its key and bindings
    no longer exist, so the gateway must stop honouring what it had cached."""
    url, key = stack.gateway.url, stack.api_key
    assert complete(url, api_key=key, user="u1").status_code == 200  # cached now
    stack.redis.kill()
    stack.redis.wipe()
    stack.redis.start()
    assert _eventually(lambda: complete(url, api_key=key, user="u1").status_code == 401)
    reply = complete(url, api_key=key, user="u1")
    assert reply.json()["error"]["code"] == "invalid_api_key"
