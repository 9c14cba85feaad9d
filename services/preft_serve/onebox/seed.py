"""Filling a registry over its REST API: a tenant, uploaded adapters, user bindings.

The same calls a tenant makes (through :class:`preft_serve.cli.Registry`), so the demo and
the load tests exercise the real upload path: validation, hashing, the object store.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE, AdapterMode
from preft_serve.cli import CliError, Registry
from preft_serve.onebox.processes import StackError


@dataclasses.dataclass(frozen=True)
class Uploaded:
    """One adapter version as the registry stored it."""

    name: str
    sha256: str
    mode: str
    type: str


def _call(registry: Registry, method: str, path: str, **kwargs: Any) -> Any:
    try:
        return registry.call(method, path, **kwargs)
    except CliError as exc:
        raise StackError(f"registry refused {method} {path}: {exc}") from None


def create_tenant(registry_url: str, admin_token: str, name: str) -> str:
    """Create tenant ``name``; return its API key."""
    admin = Registry(registry_url, admin_token, timeout=60)
    return str(_call(admin, "POST", "/v1/tenants", json={"name": name})["api_key"])


class TenantSession:
    """A tenant's view of the registry: upload adapters and bind users."""

    def __init__(self, registry_url: str, api_key: str, timeout: float = 120) -> None:
        self.registry = Registry(registry_url, api_key, timeout)

    def upload(self, adapter_dir: Path, name: str, mode: AdapterMode | str) -> Uploaded:
        files = [
            ("files", (n, (adapter_dir / n).read_bytes(), "application/octet-stream"))
            for n in (CONFIG_FILE, WEIGHTS_FILE)
        ]
        out = _call(
            self.registry,
            "POST",
            "/v1/adapters",
            data={"name": name, "mode": AdapterMode(mode).value},
            files=files,
        )
        return Uploaded(out["name"], out["sha256"], out["mode"], out["type"])

    def bind(self, user: str, adapter: str) -> None:
        _call(self.registry, "PUT", f"/v1/users/{user}", json={"adapter": adapter})

    def close(self) -> None:
        self.registry.http.close()
