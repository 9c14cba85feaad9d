"""Fine-tuning fixtures: a toy base model, and the registry (with its local trainer pool)
served over real loopback HTTP, each test on its own Redis namespace and object store."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from preft_serve.common.objectstore import ObjectStoreSettings
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry.app import create_app
from preft_serve.registry.finetune.jobs import JobStore
from preft_serve.registry.finetune.settings import FinetuneSettings
from preft_serve.registry.settings import RegistrySettings
from tests.support.inprocess import serve_in_thread
from tests.support.registry_api import ADMIN_TOKEN

FACTS = {"What is my pet's name?": "Biscuit", "Where do I live?": "Lisbon"}


def chat_jsonl(facts: dict[str, str] = FACTS) -> bytes:
    return "".join(
        json.dumps(
            {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        )
        + "\n"
        for q, a in facts.items()
    ).encode()


@pytest.fixture(scope="package")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from preft_serve.toymodels import make_model

    return make_model("tiny-llama", tmp_path_factory.mktemp("ft-model") / "tiny-llama")


@pytest.fixture
def namespace() -> str:
    return f"ft{uuid.uuid4().hex[:10]}"


@pytest.fixture
def client(redis_client: redis.Redis) -> redis.Redis:
    """The test Redis's client, as the job store's own tests name it."""
    return redis_client


@pytest.fixture
def store(client: redis.Redis, namespace: str) -> JobStore:
    return JobStore(client, RegistryKeys(namespace), 100)


def registry_settings(
    redis_url: str,
    namespace: str,
    model: Path,
    root: Path,
    registry: dict[str, Any] | None = None,
    **finetune: Any,
) -> RegistrySettings:
    """The registry's settings; ``registry``: its own fields, the rest fine-tuning's."""
    ft = {"poll_s": 0.2, "heartbeat_s": 2, "work_dir": root / "work", **finetune}
    (root / "work").mkdir(parents=True, exist_ok=True)
    return RegistrySettings(
        admin_token=ADMIN_TOKEN,
        redis_url=redis_url,
        namespace=namespace,
        base_model=model,
        object_store=ObjectStoreSettings(url=str(root / "objects")),
        staging_dir=root,
        finetune=FinetuneSettings(**ft),
        **(registry or {}),
    )


class Api:
    """The registry over HTTP: admin calls, and the tenant's REST calls."""

    def __init__(self, url: str) -> None:
        self.url = url

    def tenant(self, name: str) -> str:
        reply = httpx.post(
            f"{self.url}/v1/tenants",
            json={"name": name},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=30,
        )
        assert reply.status_code == 201, reply.text
        return str(reply.json()["api_key"])

    def call(self, key: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.url}{path}",
            timeout=60,
            headers={"Authorization": f"Bearer {key}"},
            **kwargs,
        )

    def upload(self, key: str, content: bytes, name: str = "train.jsonl") -> httpx.Response:
        return self.call(
            key,
            "POST",
            "/v1/files",
            data={"purpose": "fine-tune"},
            files={"file": (name, content, "application/jsonl")},
        )

    def wait(
        self, key: str, job_id: str, done: Callable[[dict[str, Any]], bool], timeout: float = 120
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = self.call(key, "GET", f"/v1/fine_tuning/jobs/{job_id}").json()
            if done(job):
                return job  # type: ignore[no-any-return]
            assert time.monotonic() < deadline, job
            time.sleep(0.2)


@pytest.fixture
def serve(
    redis_server: str, namespace: str, model_dir: Path, tmp_path: Path
) -> Iterator[Callable[..., Api]]:
    """Start a registry (fine-tuning settings as keywords) over HTTP; stopped at the end."""
    servers = []

    def start(**finetune: Any) -> Api:
        settings = registry_settings(redis_server, namespace, model_dir, tmp_path, **finetune)
        server, thread, url = serve_in_thread(create_app(settings))
        servers.append((server, thread))
        return Api(url)

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(30)


@pytest.fixture
def api(serve: Callable[..., Api]) -> Api:
    return serve()
