"""model.download: the init containers that fetch the base model (workers) and its
config.json (registry). The wiring is read from the rendered pods, and the command each init
container runs is executed here, as rendered, against a real S3 server (moto) and a local
HTTP server serving a tar archive."""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import socket
import subprocess
import sys
import tarfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.chart.manifests import container, env, pod_spec, secret_marker
from tests.chart.support import CHART, SCENARIOS, Rendered

SCRIPT = (CHART / "files" / "fetch-model.py").read_text()
MODEL = {  # a Hugging Face model directory, small
    "config.json": b'{"model_type": "llama", "hidden_size": 64}',
    "model.safetensors": os.urandom(300_000),
    "tokenizer.json": b'{"version": "1.0"}',
    "original/params.json": b"{}",
}
# What the chart wants on a fresh install with downloads on: a writable model volume.
WRITABLE = {
    "model.download.enabled": "true",
    "model.volume.persistentVolumeClaim.readOnly": "false",
}


def init_container(rendered: Rendered, component: str) -> dict[str, Any]:
    spec = pod_spec(rendered.component("Deployment", component))
    (found,) = [c for c in spec.get("initContainers", []) if c["name"] == "model-download"]
    return found


def write_model(root: Path) -> None:
    for name, data in MODEL.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def assert_is_the_model(path: Path) -> None:
    files = {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert files == MODEL


def run_init(spec: dict[str, Any], dest: Path, **replace: str) -> subprocess.CompletedProcess[str]:
    """Run the init container's command and args as rendered, with the model path mapped to
    ``dest`` (and any other argument replaced), the way the container would."""
    assert spec["command"][:2] == ["python3", "-c"]
    args = [replace.get(a, a) for a in spec["args"]]
    args[1] = str(dest)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    environment.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    )
    return subprocess.run(
        [sys.executable, "-c", spec["command"][2], *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def partial(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.partial-{socket.gethostname()}"


# -- wiring -------------------------------------------------------------------------------


def test_workers_fetch_the_model_before_vllm_starts(scenarios: dict[str, Rendered]) -> None:
    rendered = scenarios["model-download"]
    worker = rendered.component("Deployment", "worker")
    main = container(worker, "worker")
    fetch = init_container(rendered, "worker")
    assert pod_spec(worker)["initContainers"][0] is fetch  # before any user init container
    assert fetch["image"] == main["image"]  # the worker image: Python and boto3, no extra pull
    assert fetch["command"] == ["python3", "-c", SCRIPT]
    assert fetch["args"] == [
        "s3://acme-models/Qwen/Qwen2.5-7B-Instruct",
        "/models/qwen2.5-7b-instruct",
        "--s3-region=eu-west-1",
    ]
    args = dict(a.removeprefix("--").split("=", 1) for a in main["args"] if "=" in a)
    assert args["model"] == fetch["args"][1]
    # The init container writes the model volume, the worker only reads it.
    assert fetch["volumeMounts"] == [{"name": "model", "mountPath": "/models"}]
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in main["volumeMounts"]
    assert fetch["securityContext"] == main["securityContext"]
    assert env(fetch) == {
        "AWS_ACCESS_KEY_ID": secret_marker("model-bucket-reader", "AWS_ACCESS_KEY_ID"),
        "AWS_SECRET_ACCESS_KEY": secret_marker("model-bucket-reader", "AWS_SECRET_ACCESS_KEY"),
    }


def test_registry_fetches_config_json_into_its_own_scratch(scenarios: dict[str, Rendered]) -> None:
    rendered = scenarios["model-download"]
    registry = rendered.component("Deployment", "registry")
    main = container(registry, "registry")
    fetch = init_container(rendered, "registry")
    assert fetch["image"] == main["image"]
    assert "--config-only" in fetch["args"]  # otherwise the same source and path as workers
    assert [a for a in fetch["args"] if a != "--config-only"] == init_container(rendered, "worker")[
        "args"
    ]
    assert env(main)["PREFT_REGISTRY_BASE_MODEL"] == fetch["args"][1]
    # Never the shared model volume: a config.json there would make workers skip the model.
    volumes = {v["name"]: v for v in pod_spec(registry)["volumes"]}
    assert volumes["model"] == {"name": "model", "emptyDir": {"sizeLimit": "64Mi"}}


def test_downloads_are_off_unless_asked(
    scenarios: dict[str, Rendered], render: Callable[..., Rendered], tmp_path: Path
) -> None:
    for name in SCENARIOS:
        if name == "model-download":
            continue
        for component in ("worker", "registry"):
            spec = pod_spec(scenarios[name].component("Deployment", component))
            assert "model-download" not in [c["name"] for c in spec.get("initContainers", [])]
    # With registry.modelConfig the registry needs no download at all.
    config = tmp_path / "config.yaml"
    config.write_text('registry: {modelConfig: \'{"model_type": "llama"}\'}\n')
    rendered = render(["ci/model-download-values.yaml", str(config)])
    spec = pod_spec(rendered.component("Deployment", "registry"))
    assert "initContainers" not in spec
    assert "model" not in {v["name"] for v in spec["volumes"]}


def test_s3_credentials_default_to_the_object_stores(render: Callable[..., Rendered]) -> None:
    rendered = render(
        ["ci/external-s3-values.yaml"], {**WRITABLE, "model.download.from": "s3://models/llama"}
    )
    fetch = init_container(rendered, "worker")
    assert "--s3-endpoint-url=http://minio.storage.svc.cluster.local:9000" in fetch["args"]
    assert "--s3-region=us-east-1" in fetch["args"]
    assert env(fetch)["AWS_SECRET_ACCESS_KEY"] == secret_marker(
        "preft-s3-credentials", "secret-key"
    )
    # IRSA / node identity: no keys at all.
    assert "env" not in init_container(
        render([], {**WRITABLE, "model.download.from": "s3://models/x"}), "worker"
    )


def test_archive_urls_carry_their_checksum(render: Callable[..., Rendered]) -> None:
    digest = "ab" * 32
    rendered = render(
        [],
        {
            **WRITABLE,
            "model.download.from": "https://example.com/m.tar.gz",
            "model.download.sha256": digest,
        },
    )
    fetch = init_container(rendered, "worker")
    assert fetch["args"] == ["https://example.com/m.tar.gz", "/models/base", f"--sha256={digest}"]
    assert "env" not in fetch


def test_download_values_are_checked(render_error: Callable[..., str]) -> None:
    message = render_error(
        [], {"model.download.enabled": "true", "model.download.sha256": "ab" * 32}
    )
    assert "model.download.from is required when model.download.enabled=true" in message
    assert "model.volume.persistentVolumeClaim.readOnly must be false" in message
    message = render_error(
        [], {**WRITABLE, "model.download.from": "s3://models/x", "model.download.sha256": "ab" * 32}
    )
    assert "model.download.sha256 checks archives fetched from http(s) URLs" in message
    message = render_error([], {**WRITABLE, "model.download.from": "ftp://models/x"})
    assert "/model/download/from" in message
    # Trainer Jobs mount the model volume as it is: a per-pod download would leave it empty.
    message = render_error(["ci/model-download-values.yaml"], {"trainer.enabled": "true"})
    assert "trainer.enabled with model.download.enabled needs model.volume to be a shared" in (
        message
    )
    # Helm merges maps: another volume source next to the default claim is two sources.
    message = render_error([], {"model.volume.emptyDir.sizeLimit": "40Gi"})
    assert (
        "model.volume must be one volume source, not 2 (emptyDir, persistentVolumeClaim)" in message
    )


# -- the script, run as rendered ----------------------------------------------------------


@pytest.fixture
def s3_model(s3_server: str) -> str:
    """s3://<bucket>/<prefix> holding MODEL."""
    client = boto3.client(
        "s3",
        endpoint_url=s3_server,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    bucket = f"models-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    for name, data in MODEL.items():
        client.put_object(Bucket=bucket, Key=f"org/model/{name}", Body=data)
    client.put_object(Bucket=bucket, Key="org/model-other/config.json", Body=b"{}")
    return f"s3://{bucket}/org/model"


def test_fetches_from_s3_once_and_resumes(
    render: Callable[..., Rendered], s3_server: str, s3_model: str, tmp_path: Path
) -> None:
    rendered = render(
        ["ci/model-download-values.yaml"],
        {"model.download.from": s3_model, "model.download.s3.endpointUrl": s3_server},
    )
    worker = init_container(rendered, "worker")
    dest = tmp_path / "models" / "qwen"
    # A download that stopped half-way: a file already complete is kept, not fetched again.
    kept = partial(dest) / "tokenizer.json"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"x" * len(MODEL["tokenizer.json"]))
    result = run_init(worker, dest)
    assert result.returncode == 0, result.stderr
    assert "4 files from" in result.stdout and "1 already there" in result.stdout
    assert (dest / "tokenizer.json").read_bytes() == b"x" * len(MODEL["tokenizer.json"])
    (dest / "tokenizer.json").write_bytes(MODEL["tokenizer.json"])
    assert_is_the_model(dest)
    assert not partial(dest).exists()
    # The next pod start finds the model and fetches nothing.
    again = run_init(worker, dest)
    assert again.returncode == 0 and "nothing to fetch" in again.stdout
    # The registry's init container fetches config.json alone.
    config_dir = tmp_path / "registry" / "qwen"
    result = run_init(init_container(rendered, "registry"), config_dir)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in config_dir.iterdir()] == ["config.json"]
    assert (config_dir / "config.json").read_bytes() == MODEL["config.json"]


def test_s3_errors_name_the_source(
    render: Callable[..., Rendered], s3_server: str, s3_model: str, tmp_path: Path
) -> None:
    rendered = render(
        ["ci/model-download-values.yaml"],
        {"model.download.from": s3_model + "-missing", "model.download.s3.endpointUrl": s3_server},
    )
    result = run_init(init_container(rendered, "worker"), tmp_path / "m")
    assert result.returncode != 0
    assert f"fetch-model: no objects under {s3_model}-missing" in result.stderr
    assert not (tmp_path / "m").exists()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_dir(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A directory served over HTTP on a loopback port, and its base URL."""
    root = tmp_path / "www"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: _Quiet(*a, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def make_archive(path: Path, top: str, extra: dict[str, bytes] | None = None) -> str:
    """A .tar.gz of MODEL under ``top`` (may be ""), plus ``extra`` raw members; its sha256."""
    with tarfile.open(path, "w:gz") as archive:
        for name, data in {**{f"{top}{n}": d for n, d in MODEL.items()}, **(extra or {})}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("top", ["", "Llama-Tiny/"])
def test_fetches_a_tar_archive(
    render: Callable[..., Rendered], http_dir: tuple[Path, str], tmp_path: Path, top: str
) -> None:
    root, base = http_dir
    sha = make_archive(root / "model.tar.gz", top)
    rendered = render(
        [],
        {**WRITABLE, "model.download.from": f"{base}/model.tar.gz", "model.download.sha256": sha},
    )
    dest = tmp_path / "models" / "base"
    result = run_init(init_container(rendered, "worker"), dest)
    assert result.returncode == 0, result.stderr
    assert_is_the_model(dest)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["base"]  # no partial left
    config_dir = tmp_path / "registry" / "base"
    result = run_init(init_container(rendered, "registry"), config_dir)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in config_dir.iterdir()] == ["config.json"]


def test_refuses_a_wrong_checksum_and_unsafe_archives(
    render: Callable[..., Rendered], http_dir: tuple[Path, str], tmp_path: Path
) -> None:
    root, base = http_dir
    make_archive(root / "model.tar.gz", "")
    rendered = render(
        [],
        {
            **WRITABLE,
            "model.download.from": f"{base}/model.tar.gz",
            "model.download.sha256": "0" * 64,
        },
    )
    fetch = init_container(rendered, "worker")
    dest = tmp_path / "models" / "base"
    result = run_init(fetch, dest)
    assert result.returncode != 0 and "expected " + "0" * 64 in result.stderr
    assert not dest.exists() and not partial(dest).exists()
    # A member escaping the model directory is refused (tarfile's "data" filter).
    make_archive(root / "evil.tar.gz", "", {"../escaped.txt": b"x"})
    result = run_init(
        fetch,
        dest,
        **{f"{base}/model.tar.gz": f"{base}/evil.tar.gz", "--sha256=" + "0" * 64: "--sha256="},
    )
    assert result.returncode != 0 and "cannot fetch or unpack" in result.stderr
    assert not (tmp_path / "models" / "escaped.txt").exists() and not dest.exists()
    # An archive that is not a model directory.
    with tarfile.open(root / "other.tar", "w") as archive:
        info = tarfile.TarInfo("README.md")
        archive.addfile(info, io.BytesIO(b""))
    result = run_init(
        fetch,
        dest,
        **{f"{base}/model.tar.gz": f"{base}/other.tar", "--sha256=" + "0" * 64: "--sha256="},
    )
    assert result.returncode != 0 and "holds no config.json" in result.stderr


def test_a_directory_in_the_way_is_an_error(
    render: Callable[..., Rendered], http_dir: tuple[Path, str], tmp_path: Path
) -> None:
    """model.path exists, is not empty and holds no config.json: the download is not moved
    over it (nor mixed into it), and the message says what to do."""
    root, base = http_dir
    make_archive(root / "model.tar.gz", "")
    rendered = render([], {**WRITABLE, "model.download.from": f"{base}/model.tar.gz"})
    fetch = init_container(rendered, "worker")
    dest = tmp_path / "models" / "base"
    dest.mkdir(parents=True)
    (dest / "stray.bin").write_bytes(b"?")
    result = run_init(fetch, dest)
    assert result.returncode != 0
    assert "is not empty and holds no config.json: empty or remove it" in result.stderr
    assert not partial(dest).exists()
    assert [p.name for p in dest.iterdir()] == ["stray.bin"]
