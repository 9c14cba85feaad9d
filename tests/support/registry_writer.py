"""The registry's write path without HTTP or blobs, for tests of what reads the registry's
Redis (the clients, the gateway's cache): changes are written by the registry's own service
code, so reader and writer agree on the layout."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry.adapters import AdapterService
from preft_serve.registry.bindings import BindingService
from preft_serve.registry.tenants import TenantService
from preft_serve.registry.validation import ValidatedAdapter


class Writer:
    """The registry's write path without HTTP or blobs (metadata only)."""

    def __init__(self, url: str, namespace: str) -> None:
        self.redis = redis.Redis.from_url(url, decode_responses=True)
        self.keys = RegistryKeys(namespace)
        self.adapters = AdapterService(
            self.redis,
            self.keys,
            None,
            None,
            None,
            None,  # type: ignore[arg-type]
            events_maxlen=100_000,
        )
        self.bindings = BindingService(self.redis, self.keys, 100_000)
        self.tenants = TenantService(self.redis, self.keys, 100_000)

    def version(
        self, tenant: str, name: str, content: str, mode: AdapterMode = AdapterMode.PREFILL
    ) -> str:
        sha = hashlib.sha256(content.encode()).hexdigest()
        v = ValidatedAdapter(
            config={"peft_type": "LORA"},
            config_bytes=b'{"peft_type":"LORA"}',
            weights_path=Path("/dev/null"),
            type=AdapterType.LORA,
            mode=mode,
            rank=8,
            sha256=sha,
            size_bytes=10,
            base_model="tiny",
        )
        self.adapters.commit(tenant, name, v, create=False, stored_at=None)
        return sha


def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.01)
