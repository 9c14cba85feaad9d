"""Building blocks of the end-to-end stack: registry and gateway processes, REST helpers.

Everything is a real process talking over loopback HTTP: the registry
(``python -m preft_serve.registry``), the gateway (``python -m preft_serve.gateway``) and
vLLM workers (``tests.support.worker_process``). Tests reach them only through their public
APIs: the registry's REST API to upload and bind, the gateway's OpenAI API to generate, the
workers' own OpenAI API (``model="sha256:<hex>"``) for the expected answers.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.ports import free_port
from tests.support.processes import ServiceProcess, running_http_service

BASE_NAME = "tiny-llama"  # the gateway's public name of the base model
PROMPT = [7, 42, 99, 3, 180, 64, 12, 250, 33, 5, 77, 140, 9, 201, 18, 66, 120, 45, 230, 11]
START_TIMEOUT = 90  # registry/gateway start: imports only, but the machine is busy
# Long enough for the hot-swap test's multi-second stream (the default test cap is 256).
WORKER_MAX_MODEL_LEN = 4096


@dataclass(frozen=True)
class Base:
    """What every part of the stack is configured with."""

    root: Path
    model: Path
    objects: Path  # the registry's blob store = the workers' --object-store


def worker_args(base: Base, cache: str) -> list[str]:
    """A worker's flags: the stack's object store, its own disk cache ``cache``."""
    return [
        "--object-store",
        str(base.objects),
        "--adapter-cache-dir",
        str(base.root / cache),
        "--adapter-cache-gib",
        "0.05",
        "--max-model-len",
        str(WORKER_MAX_MODEL_LEN),
    ]


def admin_token() -> str:
    return secrets.token_hex(16)


@dataclass
class Registry:
    """The registry's REST API, as a tenant's tooling would use it."""

    url: str
    admin: str

    def create_tenant(self, name: str) -> str:
        """Create tenant ``name``; returns its API key."""
        reply = httpx.post(
            f"{self.url}/v1/tenants", json={"name": name}, headers=_bearer(self.admin), timeout=30
        )
        assert reply.status_code == 201, reply.text
        return str(reply.json()["api_key"])

    def upload(
        self,
        api_key: str,
        name: str,
        adapter: Path,
        mode: str,
        new_version: bool = False,
        promote: bool = True,
    ) -> dict[str, Any]:
        """POST (version 1) or PUT (next version: the hot swap, or with ``promote`` False
        a staged version) an adapter folder."""
        files = [
            ("files", (p.name, p.read_bytes(), "application/octet-stream"))
            for p in sorted(adapter.iterdir())
            if p.is_file()
        ]
        if new_version:
            reply = httpx.put(
                f"{self.url}/v1/adapters/{name}",
                params={"promote": "true" if promote else "false"},
                data={"mode": mode},
                files=files,
                headers=_bearer(api_key),
                timeout=60,
            )
        else:
            reply = httpx.post(
                f"{self.url}/v1/adapters",
                data={"name": name, "mode": mode},
                files=files,
                headers=_bearer(api_key),
                timeout=60,
            )
        assert reply.status_code == 201, reply.text
        return reply.json()  # type: ignore[no-any-return]

    def bind(self, api_key: str, user: str, adapter: str) -> None:
        reply = self.bind_reply(api_key, user, adapter)
        assert reply.status_code == 200, reply.text

    def bind_reply(self, api_key: str, user: str, adapter: str) -> httpx.Response:
        return httpx.put(
            f"{self.url}/v1/users/{user}",
            json={"adapter": adapter},
            headers=_bearer(api_key),
            timeout=30,
        )


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextlib.contextmanager
def running_registry(
    root: Path, redis_url: str, namespace: str, model: Path, objects: Path
) -> Iterator[Registry]:
    """``python -m preft_serve.registry`` on a free port, configured by environment."""
    port, token = free_port(), admin_token()
    env = {
        "PREFT_REGISTRY_ADMIN_TOKEN": token,
        "PREFT_REGISTRY_REDIS_URL": redis_url,
        "PREFT_REGISTRY_NAMESPACE": namespace,
        "PREFT_REGISTRY_BASE_MODEL": str(model),
        "PREFT_REGISTRY_OBJECT_STORE__URL": str(objects),
        "PREFT_REGISTRY_STAGING_DIR": str(root),
        "PREFT_REGISTRY_PORT": str(port),
        "PREFT_REGISTRY_LOG_LEVEL": "WARNING",
    }
    url = f"http://127.0.0.1:{port}"
    with running_http_service(
        "registry",
        [sys.executable, "-m", "preft_serve.registry"],
        root,
        url,
        env,
        timeout=START_TIMEOUT,
    ):
        yield Registry(url, token)


@contextlib.contextmanager
def running_gateway(
    root: Path,
    redis_url: str,
    namespace: str,
    model: Path,
    workers: Sequence[str],
    name: str = "gateway",
    extra_env: dict[str, str] | None = None,
) -> Iterator[ServiceProcess]:
    """``python -m preft_serve.gateway`` on a free port with a static worker list."""
    port = free_port()
    env = {
        "PREFT_GATEWAY_REDIS_URL": redis_url,
        "PREFT_GATEWAY_NAMESPACE": namespace,
        "PREFT_GATEWAY_WORKER_URLS": json.dumps(list(workers)),
        "PREFT_GATEWAY_BASE_MODEL_NAME": BASE_NAME,
        "PREFT_GATEWAY_WORKER_BASE_MODEL": str(model),
        "PREFT_GATEWAY_PORT": str(port),
        "PREFT_GATEWAY_LOG_LEVEL": "WARNING",
        **(extra_env or {}),
    }
    with running_http_service(
        name,
        [sys.executable, "-m", "preft_serve.gateway"],
        root,
        f"http://127.0.0.1:{port}",
        env,
        timeout=START_TIMEOUT,
    ) as process:
        yield process


def complete(
    base_url: str,
    *,
    api_key: str | None = None,
    user: str | None = None,
    model: str | None = None,
    prompt: list[int] = PROMPT,
    max_tokens: int = 8,
    timeout: float = 120,
    **extra: Any,
) -> httpx.Response:
    """A greedy ``/v1/completions`` request with a token-id prompt that never stops at EOS
    and returns the generated token ids (vLLM's ``return_token_ids``)."""
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        **extra,
    }
    if model is not None:
        body["model"] = model
    if user is not None:
        body["user"] = user
    headers = _bearer(api_key) if api_key else {}
    return httpx.post(f"{base_url}/v1/completions", json=body, headers=headers, timeout=timeout)


def token_ids(reply: httpx.Response) -> list[int]:
    assert reply.status_code == 200, reply.text
    return list(reply.json()["choices"][0]["token_ids"])


def worker_tokens(
    worker: str, sha256: str, prompt: list[int] = PROMPT, max_tokens: int = 8
) -> list[int]:
    """What the worker itself generates for adapter ``sha256`` (the expected answer)."""
    return token_ids(
        complete(worker, model=f"sha256:{sha256}", prompt=prompt, max_tokens=max_tokens)
    )


def metric_total(url: str, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` on ``url``/metrics whose labels include ``labels``."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
