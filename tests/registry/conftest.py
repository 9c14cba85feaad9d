"""Registry test fixtures: a tiny base model, adapter factories, and an app per test.

Every test gets its own Redis namespace and S3 bucket on the session's real servers, so
"Redis and the bucket are unchanged" can be checked by snapshotting exactly those.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import redis
from fastapi.testclient import TestClient

from preft_serve.common.objectstore import ObjectStoreSettings
from preft_serve.registry.app import create_app
from preft_serve.registry.settings import RegistrySettings
from tests.registry import factories
from tests.support.inprocess import serve_in_thread
from tests.support.registry_api import ADMIN_TOKEN, create_tenant

S3_CREDS = {
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
    "region_name": "us-east-1",
}


@pytest.fixture(scope="session")
def base_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with shapes pinned here (messages in tests quote them)."""
    from preft_serve.toymodels import ModelPreset, make_model

    preset = ModelPreset(
        "tiny-llama",
        "llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return make_model(preset, tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def lora_dir(base_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid rank-8 prefill LoRA for the tiny base model (seed 1)."""
    return factories.lora(base_model_dir, tmp_path_factory.mktemp("lora1"), seed=1)


@pytest.fixture(scope="session")
def lora_dir2(base_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second, different valid LoRA (seed 2)."""
    return factories.lora(base_model_dir, tmp_path_factory.mktemp("lora2"), seed=2)


@pytest.fixture
def s3(s3_server: str) -> Any:
    return boto3.client("s3", endpoint_url=s3_server, **S3_CREDS)


@pytest.fixture
def namespace() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"b-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def settings(
    redis_server: str,
    s3_server: str,
    namespace: str,
    bucket: str,
    base_model_dir: Path,
    tmp_path: Path,
) -> RegistrySettings:
    return RegistrySettings(
        admin_token=ADMIN_TOKEN,
        redis_url=redis_server,
        namespace=namespace,
        base_model=base_model_dir,
        object_store=ObjectStoreSettings(
            url=f"s3://{bucket}",
            s3_endpoint_url=s3_server,
            s3_region="us-east-1",
            s3_access_key_id="testing",
            s3_secret_access_key="testing",
        ),
        staging_dir=tmp_path,
        max_reft_rank=16,  # max_lora_rank stays the default: what the workers serve
        max_weights_bytes=4 << 20,
        max_upload_bytes=8 << 20,
    )


@pytest.fixture
def make_client(settings: RegistrySettings) -> Iterator[Callable[..., TestClient]]:
    """Build a started app; keyword arguments override settings fields."""
    clients: list[TestClient] = []

    def make(**overrides: Any) -> TestClient:
        app = create_app(settings.model_copy(update=overrides))
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


@pytest.fixture
def new_tenant(client: TestClient) -> Callable[[str], dict[str, str]]:
    return lambda name: create_tenant(client, name)


@pytest.fixture
def acme(new_tenant: Callable[[str], dict[str, str]]) -> dict[str, str]:
    return new_tenant("acme")


@pytest.fixture
def state_snapshot(
    redis_client: redis.Redis, s3: Any, namespace: str, bucket: str
) -> Callable[[], dict[str, Any]]:
    """Everything this test's registry stored: Redis keys (dumped) and bucket objects.
    The fine-tuning dispatcher's heartbeat (``:ftrunner:``, written by every registry app a
    test starts, on its own clock) is liveness, not stored state, and is left out."""

    def snapshot() -> dict[str, Any]:
        keys = sorted(
            k for k in redis_client.scan_iter(f"{namespace}:*", count=1000) if ":ftrunner:" not in k
        )
        raw = redis.Redis(connection_pool=redis_client.connection_pool)
        dumped = {k: raw.execute_command("DUMP", k, NEVER_DECODE=True) for k in keys}
        objects = sorted(
            (o["Key"], o["ETag"]) for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])
        )
        return {"redis": dumped, "bucket": objects}

    return snapshot


@pytest.fixture
def live_server(settings: RegistrySettings) -> Iterator[str]:
    """The registry on a real loopback HTTP port (uvicorn in a thread); yields its URL."""
    server, thread, url = serve_in_thread(create_app(settings))
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(10)
