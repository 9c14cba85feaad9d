"""Read side of the adapter registry, for the gateway and the workers.

Resolves ``(tenant, user)`` and ``(tenant, adapter name)`` to an :class:`AdapterRef`
(name, version, sha256, type, mode, ...) straight from the registry's Redis, with a local
cache that the registry's change events invalidate, and lists changes since a cursor so a
consumer that was away can catch up.

Two flavours share one cache and one key layout:

* :class:`RegistryClient` — blocking redis-py; a daemon thread listens for events.
  Thread-safe: call it from any number of threads (or from ``run_in_executor``).
* :class:`AsyncRegistryClient` — ``redis.asyncio``; an asyncio task listens for events.
  Use it from one event loop (the one that called ``start``); it is not thread-safe.

Consistency: events travel over Redis pub/sub, and each carries its id in the registry's
event stream. Every (re)subscription replays the stream from the last id seen before the
cache is trusted again, so nothing published while disconnected is missed. While the
listener is down the client is not ``live`` and every lookup goes to Redis; only when Redis
itself is unreachable does a lookup fall back to the cached answer (stale-if-error: cached
users keep being served through a Redis outage, never-seen ones get the connection error).
A lookup that raced with an event is not cached (an epoch counter detects the race).

``contract.py`` is the Redis layout (:class:`RegistryKeys`) and the event format
(:class:`RegistryEvent`); the registry service writes what this package reads. A name
that breaks the naming rules (``is_adapter_name`` ...) resolves to ``None``: it cannot exist,
and it is never turned into a key (it could address another one, e.g. ``bot:users``). ``cache.py``
holds the cache and the event handling; ``core.py`` every operation, written once as a
generator of Redis calls; ``sync.py`` and ``aio.py`` drive those calls (blocking or awaited).
``reader.py`` is the interface request-serving code depends on (:class:`AsyncRegistryReader`).
"""

from preft_serve.adapters.format import is_digest
from preft_serve.common.registry_client.aio import AsyncRegistryClient
from preft_serve.common.registry_client.cache import ResolveCache
from preft_serve.common.registry_client.contract import (
    ADAPTER_FIELDS,
    API_KEY_PREFIX,
    USAGE_KINDS,
    USAGE_TTL_S,
    AdapterRef,
    BlobInfo,
    ChangeBatch,
    EventType,
    InvalidKeyPart,
    KeyOwner,
    RegistryEvent,
    RegistryKeys,
    hash_api_key,
    is_adapter_name,
    is_tenant_name,
    is_usage_day,
    is_user_id,
    parse_usage,
    split_pinned,
    stream_id_key,
    usage_field,
)
from preft_serve.common.registry_client.reader import AsyncRegistryReader
from preft_serve.common.registry_client.sync import RegistryClient

__all__ = [
    "ADAPTER_FIELDS",
    "API_KEY_PREFIX",
    "USAGE_KINDS",
    "USAGE_TTL_S",
    "AdapterRef",
    "AsyncRegistryClient",
    "AsyncRegistryReader",
    "BlobInfo",
    "ChangeBatch",
    "EventType",
    "InvalidKeyPart",
    "KeyOwner",
    "RegistryClient",
    "RegistryEvent",
    "RegistryKeys",
    "ResolveCache",
    "hash_api_key",
    "is_adapter_name",
    "is_digest",
    "is_tenant_name",
    "is_usage_day",
    "is_user_id",
    "parse_usage",
    "split_pinned",
    "stream_id_key",
    "usage_field",
]
