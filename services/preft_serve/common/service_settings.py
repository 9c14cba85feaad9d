"""What every HTTP service's settings share: the registry's Redis and namespace, the bind
address and logging. The registry and the gateway extend :class:`ServiceSettings`, so the
namespace rule and the logging fields are declared once; the worker (configured through
vLLM's process, not this base) reuses :data:`NAMESPACE_PATTERN`."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

NAMESPACE_PATTERN = r"^[A-Za-z0-9_.-]{1,32}$"
"""A Redis namespace: short, and free of the ``:`` that separates key parts."""


class ServiceSettings(BaseSettings):
    """Fields of every service; a subclass sets ``model_config`` (its env prefix) and
    overrides ``port``'s default."""

    redis_url: str = Field("redis://127.0.0.1:6379/0", description="The registry's Redis")
    namespace: str = Field(
        "preft", pattern=NAMESPACE_PATTERN, description="Prefix of every Redis key and channel"
    )
    host: str = Field("127.0.0.1", description="Bind address")
    port: int = Field(8000, ge=1, le=65535, description="Port")
    log_level: str = Field("INFO", description="Log level (DEBUG, INFO, WARNING, ERROR)")
    log_json: bool = Field(False, description="Log one JSON object per line")
    keepalive_s: int = Field(
        75,
        ge=1,
        le=3600,
        description="Seconds an idle client connection stays open. Longer than the idle "
        "timeouts of clients (httpx and the openai SDK: 5 s) and load balancers (often 60 s): "
        "otherwise a client may send on a connection the server is closing, and get a reset",
    )
