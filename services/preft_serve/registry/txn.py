"""Typed wrapper over redis-py's optimistic transactions (WATCH / MULTI / EXEC).

``fn(pipe)`` reads with the pipeline in immediate mode, calls ``pipe.multi()`` and queues
writes; redis-py retries it from the start whenever a watched key changed before EXEC, so
``fn`` must be a pure function of what it reads. Exceptions raised by ``fn`` abort the
transaction and propagate.

Clients here are created with ``decode_responses=True``; redis-py's stubs still type
replies as ``bytes | str``, so service code holds the client as :data:`Redis` (``Any``) and
treats replies as ``str``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

T = TypeVar("T")
Redis = Any  # redis.Redis with decode_responses=True


def transact(client: Redis, fn: Callable[[Any], T], *watch: str) -> T:
    """Run ``fn`` as one optimistic transaction over ``watch`` keys; return its value."""
    return cast(T, client.transaction(fn, *watch, value_from_callable=True))
