"""The end-to-end stack shared by the whole package: one model, one object store, one vLLM
worker, one registry and one gateway, all real processes.

Starting a vLLM worker is the expensive part (~30 s on 2 cores), so the package starts one
and every module reuses it; modules that need something only they may break (a second
worker to kill, a Redis to crash) start that part themselves. The worker does not talk to
Redis (it fetches adapters by hash from the object store), so one worker serves every
registry/gateway pair a module builds on the same object store.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from preft_serve.toymodels import make_model
from tests.e2e.stack import Base, Registry, running_gateway, running_registry, worker_args
from tests.support.processes import ServiceProcess
from tests.support.worker_process import start_worker


@pytest.fixture(scope="package")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    root = tmp_path_factory.mktemp("e2e")
    return Base(root, make_model("tiny-llama", root / "model"), root / "objects")


@pytest.fixture(scope="package")
def worker(base: Base) -> Iterator[ServiceProcess]:
    process = start_worker(base.model, base.root, worker_args(base, "cache-w1"), name="worker1")
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="package")
def namespace() -> str:
    return f"e2e{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="package")
def registry(base: Base, redis_server: str, namespace: str) -> Iterator[Registry]:
    with running_registry(base.root, redis_server, namespace, base.model, base.objects) as reg:
        yield reg


@pytest.fixture(scope="package")
def gateway(
    base: Base, redis_server: str, namespace: str, worker: ServiceProcess, registry: Registry
) -> Iterator[ServiceProcess]:
    with running_gateway(base.root, redis_server, namespace, base.model, [worker.url]) as process:
        yield process
