"""The load-by-hash LoRA resolver: name checks, settings, and vLLM's real OpenAI server."""

from __future__ import annotations

import asyncio
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError
from vllm.lora.resolver import LoRAResolverRegistry

from preft_serve.adapters.format import (
    WEIGHTS_FILE,
    canonical_config_bytes,
    directory_digest,
    parse_model_name,
    read_config,
)
from preft_serve.common.objectstore import ObjectStore, adapter_key, create_object_store
from preft_serve.toymodels import LoraSpec, make_lora_adapter, make_model
from preft_serve.worker import serve
from preft_serve.worker.adapter_tiers.disk_cache import AdapterCacheMetrics, AdapterDiskCache
from preft_serve.worker.adapter_tiers.resolver import lora_int_id
from preft_serve.worker.settings import WorkerSettings
from preft_serve.worker.vllm_compat.lora_resolver import (
    RESOLVER_NAME,
    ObjectStoreResolver,
    register_resolver,
)
from preft_serve.worker.vllm_compat.serving import AdapterStoreUnavailable
from tests.support.worker_process import running_worker

CREDS = {"region": "us-east-1", "access_key_id": "testing", "secret_access_key": "testing"}
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
SHA = "0123456789abcdef" * 4
BAD_NAMES = [
    "/tmp/adapter",
    "../" + SHA,
    f"file:///{SHA}",
    f"s3://bucket/adapters/{SHA}",
    f"https://example.com/{SHA}",
    SHA,
    f"sha256:{SHA.upper()}",
    f"sha256:{SHA[:-1]}",
    f"sha256:{SHA}0",
    f"sha256:{SHA}/",
    f"sha256:{SHA}\n",
    f"SHA256:{SHA}",
    f"sha256:/{SHA[1:]}",
    f"md5:{SHA}",
    "sha256:",
    "",
    "named-adapter",
]


class TripwireStore:
    """An object store that must not be touched."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"object store used: {name}")


def upload(store: ObjectStore, adapter_dir: Path) -> str:
    sha = directory_digest(adapter_dir)
    store.put_adapter(
        sha, canonical_config_bytes(read_config(adapter_dir)), adapter_dir / WEIGHTS_FILE
    )
    return sha


# -- unit ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BAD_NAMES)
def test_rejected_names_return_none_without_touching_the_store(name: str, tmp_path: Path) -> None:
    cache = AdapterDiskCache(
        TripwireStore(),
        tmp_path / "cache",
        1 << 20,  # type: ignore[arg-type]
        metrics=AdapterCacheMetrics(CollectorRegistry()),
    )
    resolver = ObjectStoreResolver(WorkerSettings(object_store_url=str(tmp_path)), cache=cache)
    assert parse_model_name(name) is None
    assert asyncio.run(resolver.resolve_lora("base", name)) is None
    assert list((tmp_path / "cache").iterdir()) == []


def test_resolves_hash_from_s3_into_the_cache(tmp_path: Path, s3_server: str) -> None:
    model = make_model("tiny-llama", tmp_path / "model")
    adapter = make_lora_adapter(model, tmp_path / "adapter", seed=5, spec=LoraSpec(rank=4))
    store = create_object_store(
        f"s3://res-{uuid.uuid4().hex[:10]}", endpoint_url=s3_server, create_bucket=True, **CREDS
    )
    sha = upload(store, adapter)
    metrics = CollectorRegistry()
    cache = AdapterDiskCache(
        store, tmp_path / "cache", 1 << 30, metrics=AdapterCacheMetrics(metrics)
    )
    resolver = ObjectStoreResolver(WorkerSettings(object_store_url="s3://unused"), cache=cache)

    request = asyncio.run(resolver.resolve_lora(str(model), f"sha256:{sha}"))

    assert request is not None
    assert request.lora_name == f"sha256:{sha}"
    assert request.lora_int_id == lora_int_id(sha) > 0
    assert Path(request.lora_path) == (tmp_path / "cache" / sha).resolve()
    assert directory_digest(request.lora_path) == sha
    assert asyncio.run(resolver.resolve_lora(str(model), f"sha256:{'e' * 64}")) is None
    assert [
        metrics.get_sample_value(
            "preft_worker_adapter_loads_total", {"tier": "disk", "outcome": outcome}
        )
        for outcome in ("miss", "not_found")
    ] == [1, 1]  # one download, one unknown


@pytest.mark.parametrize("how", ["moved", "replaced by a file"])
def test_store_outage_is_unavailable_not_unknown(tmp_path: Path, how: str) -> None:
    """The local store's directory disappears after start-up: 503 to retry, never "does not
    exist" (None), no hash or errno for the client, and the worker never recreates it."""
    model = make_model("tiny-llama", tmp_path / "model")
    adapter = make_lora_adapter(model, tmp_path / "adapter", seed=5, spec=LoraSpec(rank=4))
    objects = tmp_path / "objects"
    sha = upload(create_object_store(str(objects), create_root=True), adapter)
    settings = WorkerSettings(object_store_url=str(objects))
    metrics = CollectorRegistry()
    cache = AdapterDiskCache(
        settings.create_store(), tmp_path / "cache", 1 << 30, metrics=AdapterCacheMetrics(metrics)
    )
    resolver = ObjectStoreResolver(settings, cache=cache)
    objects.rename(tmp_path / "moved")
    if how == "replaced by a file":
        objects.write_bytes(b"")

    with pytest.raises(AdapterStoreUnavailable) as info:
        asyncio.run(resolver.resolve_lora(str(model), f"sha256:{sha}"))

    assert info.value.http_status == 503
    assert info.value.message == "the adapter store is unavailable; retry shortly"
    assert objects.is_file() if how == "replaced by a file" else not objects.exists()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []
    assert (
        metrics.get_sample_value(
            "preft_worker_adapter_loads_total", {"tier": "disk", "outcome": "error"}
        )
        == 1
    )
    objects.unlink(missing_ok=True)
    (tmp_path / "moved").rename(objects)  # back: the same name resolves
    assert asyncio.run(resolver.resolve_lora(str(model), f"sha256:{sha}")) is not None


class BlockingCache:
    """A disk cache whose downloads block until released; counts how many run at once."""

    def __init__(self, root: Path) -> None:
        self.root, self.release = root, threading.Event()
        self.lock, self.running, self.most, self.threads = threading.Lock(), 0, 0, set()

    def get(self, sha256: str) -> Path:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.threads.add(threading.current_thread().name)
        try:
            assert self.release.wait(10), "download never released"
            return self.root / sha256
        finally:
            with self.lock:
                self.running -= 1


def test_cold_adapters_download_off_the_event_loop_two_at_a_time(tmp_path: Path) -> None:
    """While cold adapters download, the server's event loop keeps running (its streams
    keep flowing), and a burst of new adapters downloads ``resolver_threads`` at a time."""
    cache = BlockingCache(tmp_path)
    resolver = ObjectStoreResolver(
        WorkerSettings(object_store_url=str(tmp_path), resolver_threads=2), cache=cache
    )  # type: ignore[arg-type]
    names = [f"sha256:{c * 64}" for c in "abcde"]

    async def scenario() -> list[Any]:
        ticks = 0

        async def stream() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.002)

        ticker = asyncio.create_task(stream())
        pending = [asyncio.create_task(resolver.resolve_lora("base", n)) for n in names]
        while cache.running < 2:
            await asyncio.sleep(0.01)
        before = ticks
        await asyncio.sleep(0.2)  # every download is blocked right now
        assert ticks > before + 5, "the event loop stalled behind a download"
        assert cache.running == 2 and not any(task.done() for task in pending)
        cache.release.set()
        done = await asyncio.gather(*pending)
        ticker.cancel()
        return done

    requests = asyncio.run(scenario())
    assert [r.lora_path for r in requests] == [str(tmp_path / n[7:]) for n in names]
    assert cache.most == 2
    assert all(name.startswith("preft-resolve") for name in cache.threads)


def test_int_id_is_stable_positive_and_distinct() -> None:
    assert lora_int_id(SHA) == lora_int_id(SHA)
    assert lora_int_id("0" * 64) == 1
    assert lora_int_id("f" * 64) < 2**63 and lora_int_id("f" * 64) != lora_int_id("e" * 64)


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PREFT_WORKER_OBJECT_STORE_URL", "s3://bucket/prefix")
    monkeypatch.setenv("PREFT_WORKER_S3_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("PREFT_WORKER_ADAPTER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PREFT_WORKER_ADAPTER_CACHE_BYTES", str(5 << 30))
    settings = WorkerSettings()
    assert settings.resolver_enabled
    assert (settings.object_store_url, settings.s3_endpoint_url) == (
        "s3://bucket/prefix",
        "http://127.0.0.1:9000",
    )
    assert (settings.adapter_cache_dir, settings.adapter_cache_bytes) == (tmp_path, 5 << 30)
    monkeypatch.setenv("PREFT_WORKER_OBJECT_STORE_URL", "ftp://host/x")
    with pytest.raises(ValidationError, match="valid: local"):
        WorkerSettings()


def test_plugin_registers_resolver_only_when_configured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("PREFT_WORKER_OBJECT_STORE_URL", raising=False)
    assert register_resolver() is None
    assert RESOLVER_NAME not in LoRAResolverRegistry.get_supported_resolvers()
    monkeypatch.setenv("PREFT_WORKER_OBJECT_STORE_URL", str(tmp_path / "objects"))
    try:
        first = register_resolver()
        assert first is not None
        assert LoRAResolverRegistry.get_resolver(RESOLVER_NAME) is first
        assert register_resolver() is first  # idempotent: vLLM calls plugins repeatedly
        assert not (tmp_path / "objects").exists()  # nothing built until the first resolve
    finally:
        LoRAResolverRegistry.resolvers.pop(RESOLVER_NAME, None)


def test_serve_flags_set_the_resolver_environment(tmp_path: Path) -> None:
    args, _ = serve.parser().parse_known_args(
        [
            "--model",
            "m",
            "--object-store",
            "s3://b/p",
            "--s3-endpoint-url",
            "http://h:9000",
            "--adapter-cache-dir",
            str(tmp_path),
            "--adapter-cache-gib",
            "0.5",
        ]
    )
    assert serve.resolver_env(args) == {
        "PREFT_WORKER_OBJECT_STORE_URL": "s3://b/p",
        "PREFT_WORKER_S3_ENDPOINT_URL": "http://h:9000",
        "PREFT_WORKER_ADAPTER_CACHE_DIR": str(tmp_path.resolve()),
        "PREFT_WORKER_ADAPTER_CACHE_BYTES": str(1 << 29),
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
    }
    plain, _ = serve.parser().parse_known_args(["--model", "m"])
    assert serve.resolver_env(plain) == {}
    lonely, _ = serve.parser().parse_known_args(["--model", "m", "--adapter-cache-gib", "1"])
    with pytest.raises(SystemExit, match="needs --object-store"):
        serve.resolver_env(lonely)


# -- end to end: vLLM's OpenAI server, a moto S3 bucket, adapters by hash -----------------


class Worker:
    def __init__(
        self,
        url: str,
        model: str,
        sha: str,
        corrupt_sha: str,
        bucket: str,
        cache: Path,
        other: Path,
    ) -> None:
        self.url, self.model, self.sha, self.corrupt_sha = url, model, sha, corrupt_sha
        self.bucket, self.cache, self.other = bucket, cache, other

    def complete(self, model: str, prompt: str = "The quick brown fox") -> httpx.Response:
        return httpx.post(
            f"{self.url}/v1/completions",
            timeout=60,
            json={
                "model": model,
                "prompt": prompt,
                "max_tokens": 12,
                "temperature": 0,
                "ignore_eos": True,
            },
        )


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory, s3_server: str) -> Iterator[Worker]:
    root = tmp_path_factory.mktemp("resolver-e2e")
    model = make_model("tiny-llama", root / "model")
    adapter = make_lora_adapter(model, root / "adapters" / "named", seed=7, spec=LoraSpec(rank=8))
    other = make_lora_adapter(model, root / "other", seed=8, spec=LoraSpec(rank=8))
    bucket = f"e2e-{uuid.uuid4().hex[:10]}"
    store = create_object_store(
        f"s3://{bucket}/blobs", endpoint_url=s3_server, create_bucket=True, **CREDS
    )
    sha, corrupt_sha = upload(store, adapter), upload(store, other)
    store.put_bytes(adapter_key(corrupt_sha, WEIGHTS_FILE), b"\0" * 64)

    args = [
        "--adapter-dir",
        str(root / "adapters"),
        "--object-store",
        f"s3://{bucket}/blobs",
        "--s3-endpoint-url",
        s3_server,
        "--adapter-cache-dir",
        str(root / "cache"),
        "--adapter-cache-gib",
        "0.01",
    ]
    with running_worker(model, root, args, env=AWS_ENV) as url:
        yield Worker(url, str(model), sha, corrupt_sha, bucket, root / "cache", other)


def test_server_loads_adapter_by_hash_from_s3(worker: Worker) -> None:
    by_hash = worker.complete(f"sha256:{worker.sha}")
    assert by_hash.status_code == 200, by_hash.text
    by_name = worker.complete("named")  # the same adapter, registered by --lora-modules
    base = worker.complete(worker.model)
    assert by_name.status_code == base.status_code == 200

    text = by_hash.json()["choices"][0]["text"]
    assert text == by_name.json()["choices"][0]["text"]
    assert text != base.json()["choices"][0]["text"]  # the adapter really changed the output
    assert by_hash.json()["usage"]["completion_tokens"] == 12

    metrics = httpx.get(f"{worker.url}/metrics", timeout=10).text
    assert 'preft_worker_adapter_loads_total{outcome="miss",tier="disk"} 1.0' in metrics
    assert 'preft_worker_resident_adapters{tier="disk"} 1.0' in metrics


def test_server_refuses_runtime_adapter_loading(worker: Worker) -> None:
    """Runtime LoRA updating is on (the resolver needs it), yet nobody reaching the worker
    can load other weights under a content address or drop a served adapter: vLLM's
    load/unload routes, SageMaker's aliases of them and its engine-control routes answer
    404, and the adapters served, by name and by hash, are unchanged."""
    foreign = f"sha256:{'ef' * 32}"  # in no store: only a runtime load could serve it
    before = worker.complete(f"sha256:{worker.sha}")
    assert before.status_code == 200, before.text

    def served() -> list[tuple[str, str, str | None]]:  # not "created": the time of asking
        data = httpx.get(f"{worker.url}/v1/models", timeout=10).json()["data"]
        return [(m["id"], m["root"], m["parent"]) for m in data]

    models = served()
    assert len(models) >= 2  # the base model and "named"
    attempts = [
        ("POST", "/v1/load_lora_adapter", {"lora_name": foreign, "lora_path": str(worker.other)}),
        (
            "POST",
            "/v1/load_lora_adapter",
            {
                "lora_name": f"sha256:{worker.sha}",
                "lora_path": str(worker.other),
                "load_inplace": True,
            },
        ),
        ("POST", "/adapters", {"name": foreign, "src": str(worker.other)}),
        ("POST", "/v1/unload_lora_adapter", {"lora_name": "named"}),
        ("DELETE", "/adapters/named", None),
        ("POST", "/scale_elastic_ep", {"new_data_parallel_size": 2}),
        ("POST", "/inference/v1/abort_requests", {"request_ids": ["x"]}),
    ]
    for method, path, body in attempts:
        reply = httpx.request(method, f"{worker.url}{path}", json=body, timeout=30)
        assert reply.status_code == 404, (path, reply.text)
        assert reply.json() == {"detail": "Not Found"}, path

    assert served() == models
    refused = worker.complete(foreign)
    assert refused.status_code == 404, refused.text
    assert "does not exist" in refused.json()["error"]["message"]
    after, named = worker.complete(f"sha256:{worker.sha}"), worker.complete("named")
    assert after.status_code == named.status_code == 200
    text = before.json()["choices"][0]["text"]
    assert after.json()["choices"][0]["text"] == named.json()["choices"][0]["text"] == text


def test_server_answers_404_for_unknown_or_malformed_names(worker: Worker) -> None:
    for name in (
        f"sha256:{'ab' * 32}",
        f"sha256:{worker.sha.upper()}",
        "/etc/passwd",
        f"s3://bucket/adapters/{worker.sha}",
    ):
        response = worker.complete(name)
        assert response.status_code == 404, (name, response.text)
        assert "does not exist" in response.json()["error"]["message"]


def test_server_refuses_corrupt_blob_with_an_error(worker: Worker) -> None:
    response = worker.complete(f"sha256:{worker.corrupt_sha}")
    assert response.status_code == 500, response.text
    assert "corrupt" in response.json()["error"]["message"]
    ok = worker.complete(f"sha256:{worker.sha}")  # the server is still healthy
    assert ok.status_code == 200


def test_server_answers_503_while_the_store_is_unavailable(worker: Worker, s3_server: str) -> None:
    """The bucket disappears: a hash not yet on the worker's disk is a 503 to retry (not a
    404 "does not exist"), its body names no hash, bucket or errno; once the bucket is back
    the same request gets the honest 404 again."""
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_server,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    saved = {
        o["Key"]: s3.get_object(Bucket=worker.bucket, Key=o["Key"])["Body"].read()
        for o in s3.list_objects_v2(Bucket=worker.bucket).get("Contents", [])
    }
    for key in saved:
        s3.delete_object(Bucket=worker.bucket, Key=key)
    s3.delete_bucket(Bucket=worker.bucket)
    unknown = "cd" * 32
    try:
        response = worker.complete(f"sha256:{unknown}")
    finally:
        s3.create_bucket(Bucket=worker.bucket)
        for key, body in saved.items():
            s3.put_object(Bucket=worker.bucket, Key=key, Body=body)

    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert (error["message"], error["code"]) == (AdapterStoreUnavailable.MESSAGE, 503)
    for leak in (unknown, worker.bucket, "Errno", "does not exist"):
        assert leak not in response.text
    after = worker.complete(f"sha256:{unknown}")
    assert after.status_code == 404 and "does not exist" in after.json()["error"]["message"]


def test_a_held_adapter_missing_from_the_disk_cache_is_fetched_again(worker: Worker) -> None:
    """vLLM's server asks no resolver about an adapter it already holds; its directory
    leaving the disk cache (evicted, or removed) must not leave the engine a path that is
    gone for its next load from disk: the next request fetches it again first."""

    def misses() -> float:
        metrics = httpx.get(f"{worker.url}/metrics", timeout=10).text
        line = next(
            x
            for x in metrics.splitlines()
            if x.startswith('preft_worker_adapter_loads_total{outcome="miss"')
        )
        return float(line.rsplit(" ", 1)[1])

    first = worker.complete(f"sha256:{worker.sha}")  # held by the server from here on
    assert first.status_code == 200, first.text
    before = misses()
    shutil.rmtree(worker.cache / worker.sha)
    again = worker.complete(f"sha256:{worker.sha}")
    assert again.status_code == 200, again.text
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    assert (worker.cache / worker.sha / WEIGHTS_FILE).is_file()
    assert misses() == before + 1
