"""The registry's key layout refuses names that would address another key, and the read
clients answer "no such adapter/binding" for them instead of reading internal keys
(``resolve_adapter("acme", "bot:users")`` read bot's user set: a WRONGTYPE error)."""

from __future__ import annotations

import asyncio

import pytest

from preft_serve.common.registry_client import (
    AsyncRegistryClient,
    InvalidKeyPart,
    RegistryClient,
    RegistryKeys,
)
from tests.support.registry_writer import Writer

BAD_ADAPTERS = ["bot:users", "bot:versions", "bot\n", "", "a" * 65, "a..b", "-x"]
BAD_USERS = ["alice:x", "alice\n", "", "a" * 129, "al ice"]
BAD_TENANTS = ["acme:adapter:bot", "acme\n", "Acme", "a"]


@pytest.fixture
def writer(redis_server: str, namespace: str) -> Writer:
    w = Writer(redis_server, namespace)
    w.version("acme", "bot", "v1")
    w.version("acme", "bot", "v2")
    w.bindings.bind("acme", "alice", "bot")
    return w


@pytest.mark.parametrize("name", BAD_ADAPTERS)
def test_keys_refuse_adapter_names_that_address_other_keys(name):
    keys = RegistryKeys("ns")
    for build in (keys.adapter, keys.versions, keys.adapter_users):
        with pytest.raises(InvalidKeyPart, match="adapter name"):
            build("acme", name)


@pytest.mark.parametrize("user", BAD_USERS)
def test_keys_refuse_bad_user_ids(user):
    with pytest.raises(InvalidKeyPart, match="user id"):
        RegistryKeys("ns").binding("acme", user)


@pytest.mark.parametrize("tenant", BAD_TENANTS)
def test_keys_refuse_bad_tenant_names(tenant):
    keys = RegistryKeys("ns")
    for build in (
        keys.tenant,
        keys.tenant_rate_limits,
        keys.tenant_keys,
        keys.adapters,
        keys.adapter_prefix,
    ):
        with pytest.raises(InvalidKeyPart, match="tenant name"):
            build(tenant)
    with pytest.raises(InvalidKeyPart):
        keys.binding(tenant, "alice")


def test_keys_refuse_non_digests():
    keys = RegistryKeys("ns")
    for bad in ("x", "A" * 64, "0" * 63, "0" * 64 + ":config"):
        with pytest.raises(InvalidKeyPart):
            keys.blob(bad)
        with pytest.raises(InvalidKeyPart):
            keys.api_key(bad)
    assert keys.blob("0" * 64) == "ns:blob:" + "0" * 64


def test_invalid_key_part_is_short_and_a_value_error():
    with pytest.raises(ValueError) as err:
        RegistryKeys("ns").adapter("acme", "x" * 100_000)
    assert len(str(err.value)) < 300


def test_sync_client_treats_invalid_names_as_absent(writer, redis_server, namespace):
    for cache in (True, False):
        with RegistryClient(redis_server, namespace=namespace, cache=cache) as client:
            assert client.resolve_adapter("acme", "bot").version == 2
            for name in BAD_ADAPTERS:
                assert client.resolve_adapter("acme", name) is None, name
            for user in BAD_USERS:
                assert client.resolve_user("acme", user) is None, user
            for tenant in BAD_TENANTS:
                assert client.resolve_user(tenant, "alice") is None
                assert client.resolve_adapter(tenant, "bot") is None
            assert client.blob_info("not-a-digest:config") is None
    # Nothing was touched: the history and the binding are intact.
    assert writer.redis.hlen(writer.keys.versions("acme", "bot")) == 2
    assert writer.redis.smembers(writer.keys.adapter_users("acme", "bot")) == {"alice"}


def test_async_client_treats_invalid_names_as_absent(writer, redis_server, namespace):
    async def scenario() -> None:
        async with AsyncRegistryClient(redis_server, namespace=namespace) as client:
            assert (await client.resolve_user("acme", "alice")).name == "bot"
            for name in BAD_ADAPTERS:
                assert await client.resolve_adapter("acme", name) is None, name
            for user in BAD_USERS:
                assert await client.resolve_user("acme", user) is None, user
            assert await client.resolve_adapter("Acme", "bot") is None
            assert await client.adapter_names("acme:adapter:bot") == []
            assert await client.blob_info("x") is None

    asyncio.run(scenario())


def test_rate_limit_keys_check_the_tenant_and_take_any_user() -> None:
    keys = RegistryKeys("ns")
    assert keys.rate_limit("tenant", "acme") == "ns:ratelimit:tenant:acme"
    assert keys.rate_limit("user-tokens", "acme", "a:b") == "ns:ratelimit:user-tokens:acme:a:b"
    for tenant in BAD_TENANTS:
        with pytest.raises(InvalidKeyPart):
            keys.rate_limit("tenant", tenant)
