"""Blocking registry client: a daemon thread listens for events; thread-safe."""

from __future__ import annotations

import threading
from typing import Any, Self

import redis
from redis.retry import Retry

from preft_serve.common.registry_client.contract import (
    AdapterRef,
    BlobInfo,
    ChangeBatch,
    KeyOwner,
)
from preft_serve.common.registry_client.core import (
    RETRY_ATTEMPTS,
    RegistryCore,
    drive,
    retry_backoff,
    without_retry,
)


def connect_redis(url: str, **kwargs: Any) -> redis.Redis:
    """A blocking Redis client whose commands survive a Redis restart: a command on a
    connection pooled before the restart is retried once on a fresh one (as the gateway's
    :func:`~preft_serve.common.registry_client.aio.connect_redis`), instead of failing
    with "Connection closed by server" after Redis is back. A transaction that was
    watching keys raises ``WatchError`` and is redone from the start by its caller."""
    return redis.Redis.from_url(
        url, decode_responses=True, retry=Retry(retry_backoff(), RETRY_ATTEMPTS), **kwargs
    )


class RegistryClient(RegistryCore):
    """Blocking client with a listener thread; see the module docstring.

    Arguments as :class:`RegistryCore`: ``redis_url`` or ``client`` (a ``redis.Redis``),
    ``namespace``, ``cache`` (False: always read Redis, as the registry itself does),
    ``max_cache_entries``, ``cursor`` (``start`` replays every event since it to the
    listeners before going live).

    >>> client = RegistryClient("redis://localhost:6379/0").start()
    >>> ref = client.resolve_user("acme", "user-42")   # AdapterRef | None
    """

    def _init_listener(self) -> None:
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._thread: threading.Thread | None = None
        self._listen_redis: redis.Redis | None = None

    def _new_pubsub(self) -> Any:
        """The listener's subscription, on connections that never retry (``without_retry``)."""
        if self._listen_redis is None:
            self._listen_redis = redis.Redis(
                connection_pool=redis.ConnectionPool(**without_retry(self.redis.connection_pool))
            )
        # Through Any: redis-py types pubsub() from 8.2 on, earlier versions leave it untyped.
        listen: Any = self._listen_redis
        return listen.pubsub()

    @staticmethod
    def _connect(redis_url: str) -> redis.Redis:
        return connect_redis(redis_url)

    def start(self, timeout: float = 10.0) -> Self:
        """Start the event listener; return once it is live (or raise TimeoutError)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=drive, args=(self._listen(),), name="registry-events", daemon=True
            )
            self._thread.start()
        if not self._caught_up.wait(timeout):
            raise TimeoutError("registry client could not subscribe to events in time")
        return self

    def close(self) -> None:
        """Stop listening; closes the Redis client too if this object created it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._live = False
        if self._listen_redis is not None:
            self._listen_redis.close()
        if self._owns_client:
            self.redis.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stopping(self) -> bool:
        return self._stop.is_set()

    def _pause(self, seconds: float) -> Any:
        return self._stop.wait(seconds)

    def _close_pubsub(self, pubsub: Any) -> Any:
        return pubsub.close()

    def resolve_user(self, tenant: str, user: str) -> AdapterRef | None:
        """Adapter bound to ``user`` in ``tenant``; ``None`` when unbound (base model)."""
        return drive(self._resolve_user(tenant, user))

    def resolve_adapter(self, tenant: str, name: str) -> AdapterRef | None:
        """Current version of a tenant's adapter; ``None`` if it does not exist."""
        return drive(self._resolve_adapter(tenant, name))

    def adapters(self, tenant: str, limit: int = 1000) -> list[AdapterRef]:
        """Current versions of the tenant's first ``limit`` adapters in name order (not
        cached)."""
        return drive(self._adapters(tenant, limit))

    def authenticate(self, api_key: str) -> KeyOwner | None:
        """Owner of a valid API key; ``None`` for unknown or revoked ones (cached until an
        ``apikey.revoked`` event)."""
        return drive(self._authenticate(api_key))

    def blob_info(self, sha256: str) -> BlobInfo | None:
        """Type, mode, rank, base model and config of stored content (immutable: cached)."""
        return drive(self._blob_info(sha256))

    def latest_cursor(self) -> str:
        """Id of the newest event ("0-0" when none): where a fresh consumer starts."""
        return drive(self._latest_cursor())

    def changes_since(self, cursor: str = "0-0", limit: int = 1000) -> ChangeBatch:
        """Up to ``limit`` events after ``cursor``, the next cursor, and a reset flag."""
        return drive(self._changes_since(cursor, limit))
