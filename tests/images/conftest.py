"""The chart's containers run from the built images: ``make images`` once per session, the
chart rendered with ``values.yaml`` here, and the registry, worker and gateway pods started
from their images' root filesystems as rendered (:mod:`tests.images.pods`), against a
redis-server and a moto S3 server on this host, with a fake Kubernetes API whose kubelet
runs the registry's fine-tuning Jobs from the trainer image.

What differs from a cluster, and only this: the pods share the host's network, so each
listening port (PREFT_*_PORT, --port) becomes a free loopback port, and each service
address (Redis, S3, the registry's Service) becomes ``127.0.0.1:<its port>``; the headless
worker Service's name resolves to 127.0.0.1 through the pod's /etc/hosts, as cluster DNS
would resolve it to the worker's pod IP. Everything else comes from the rendered manifests.

Needs root (mount namespaces, chroot), buildah and debootstrap (``scripts/system-packages.sh
test`` installs them); without them these tests skip locally and fail under CI=1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
import redis

from preft_serve.common.local_redis import running_redis
from tests.chart.manifests import container, container_port, pod_spec
from tests.chart.support import ROOT, Rendered, find_tool, parse, run_helm, template_args
from tests.images.fake_kube import FakeKube
from tests.images.pods import Image, Objects, Pod, resolve_env, substitute
from tests.support.ports import free_port
from tests.support.processes import ServiceProcess
from tests.support.worker_process import WORKER_START_TIMEOUT_S

VALUES = Path(__file__).with_name("values.yaml")
MODEL_NAME = "tiny-llama"
MODELS_ROOT = "/models"  # values.yaml: model.path is /models/tiny-llama
S3_SERVICE = "s3.storage.svc.cluster.local:9000"
# How the chart names the other services (each must be remapped where a pod uses it).
REDIS = "prod-preft-serve-redis:6379"
REGISTRY = "prod-preft-serve-registry.llm.svc:8081"
S3_SECRET = {"preft-s3": {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}}
BUCKET = "preft-images-test"
IMAGES = ("gateway", "registry", "worker-cpu", "trainer")


def _missing_tools() -> str | None:
    if os.geteuid() != 0:
        return "the image tests need root (mount namespaces, chroot)"
    missing = [
        t for t in ("buildah", "debootstrap", "unshare", "openssl") if shutil.which(t) is None
    ]
    if missing:
        return f"{', '.join(missing)} missing; `scripts/system-packages.sh test` installs them"
    return None


BUILD_TIMEOUT_S = 2400
"""A fresh machine builds every image in about 10 minutes, a busy shared CI machine in more
than 15; the tests that build them run under a timeout above this one (``test_containers``),
so that a build that runs too long fails with its log instead of being killed blind."""


@pytest.fixture(scope="session")
def built_images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``make images`` once per session (layers and the stand-in base are reused)."""
    problem = _missing_tools()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    log = tmp_path_factory.mktemp("images") / "make-images.log"
    report = tmp_path_factory.getbasetemp() / "images-report.json"
    with log.open("w") as out:
        try:
            result = subprocess.run(
                ["make", "images", f"ARGS=--builder buildah --report {report}"],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"make images ran past {BUILD_TIMEOUT_S} s; its log ends:\n"
                f"{log.read_text()[-6000:]}"
            )
    assert result.returncode == 0, f"make images failed:\n{log.read_text()[-6000:]}"
    data: dict[str, Any] = json.loads(report.read_text())
    assert set(data["images"]) == set(IMAGES)
    return data


@pytest.fixture(scope="session")
def images(built_images: dict[str, Any]) -> Iterator[dict[str, Image]]:
    """A working container (rootfs) per built image; removed at the end."""
    mounted = {name: Image.mount(item["tag"]) for name, item in built_images["images"].items()}
    yield mounted
    for image in mounted.values():
        image.remove()


@pytest.fixture(scope="session")
def rendered() -> Rendered:
    helm = find_tool("helm", "HELM", ROOT / ".tools" / "bin" / "helm")
    result = run_helm(helm, *template_args([str(VALUES)]))
    assert result.returncode == 0, result.stderr
    return parse(result.stdout)


@dataclass
class Stack:
    """The running pods and what a test needs to call them."""

    root: Path
    model: Path  # host path of the model directory
    rendered: Rendered
    admin_token: str
    ports: dict[str, int]  # component -> host port of its `http` container port
    pods: dict[str, Pod] = field(default_factory=dict)
    processes: dict[str, ServiceProcess] = field(default_factory=dict)
    kube: FakeKube | None = None

    def url(self, component: str) -> str:
        return f"http://127.0.0.1:{self.ports[component]}"


def _service_addresses(rendered: Rendered, component: str) -> list[str]:
    """``name.ns.svc.cluster.local:port``, ``name.ns.svc:port`` and ``name:port`` of a
    component's Service."""
    service = rendered.component("Service", component)
    name, ns = service["metadata"]["name"], service["metadata"]["namespace"]
    port = service["spec"]["ports"][0]["port"]
    return [f"{name}.{ns}.svc.cluster.local:{port}", f"{name}.{ns}.svc:{port}", f"{name}:{port}"]


def _pod(
    rendered: Rendered,
    component: str,
    image: Image,
    objects: Objects,
    addresses: dict[str, str],
    port_env: str | None,
    port_arg: bool,
    host_port: int,
    volumes: dict[str, Path],
    workdir: Path,
    expect: list[str],
    hosts: dict[str, str] | None = None,
) -> Pod:
    """A component's pod with the listening port and service addresses remapped; every
    substitution must have matched, so a chart change that moves one fails here."""
    workload = rendered.component("Deployment", component)
    spec = container(workload)
    env = resolve_env(spec, objects, {"status.podIP": "127.0.0.1"})
    env, used = substitute(env, addresses)
    args, used_args = substitute(list(spec.get("args") or []), addresses)
    port = container_port(spec, "http")
    if port_env:
        assert env[port_env] == str(port), (component, port_env, env[port_env])
        env[port_env] = str(host_port)
    if port_arg:
        assert f"--port={port}" in args, args
        args = [f"--port={host_port}" if a == f"--port={port}" else a for a in args]
    pod = Pod(
        component,
        image,
        pod_spec(workload),
        spec,
        env,
        args,
        volumes,
        hosts=hosts or {},
        workdir=workdir / component,
    )
    substituted = {addresses[a] for a in used | used_args}
    wanted = {addresses[a] for a in expect}
    assert substituted == wanted, (component, substituted, wanted)
    return pod


@pytest.fixture(scope="session")
def stack(
    images: dict[str, Image], rendered: Rendered, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    from preft_serve.toymodels import make_model

    root = tmp_path_factory.mktemp("pods")
    models = root / "models"
    model = make_model("tiny-llama", models / MODEL_NAME)
    # The pods read the model as uid 10001 (a volume the cluster provides read-only).
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    objects = Objects.from_manifests(rendered.docs, S3_SECRET)
    registry_secret = objects.secrets
    with running_redis() as plain_url, _moto(root) as s3_url:
        # The bundled Redis's password, as the chart generated it (the redis-server here
        # stands in for the chart's Redis StatefulSet).
        (password,) = [
            v["redis-password"] for v in registry_secret.values() if "redis-password" in v
        ]
        redis.Redis.from_url(plain_url).config_set("requirepass", password)
        redis_port = plain_url.rsplit(":", 1)[1].split("/")[0]
        boto3.client(
            "s3",
            endpoint_url=s3_url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket=BUCKET)
        ports = {c: free_port() for c in ("gateway", "registry", "worker")}
        addresses = dict.fromkeys(_service_addresses(rendered, "redis"), f"127.0.0.1:{redis_port}")
        addresses |= dict.fromkeys(
            _service_addresses(rendered, "registry"), f"127.0.0.1:{ports['registry']}"
        )
        addresses[S3_SERVICE] = s3_url.removeprefix("http://")
        (admin_token,) = [v["admin-token"] for v in registry_secret.values() if "admin-token" in v]
        s = Stack(root, model, rendered, admin_token, ports)
        kube = FakeKube(
            lambda job: _run_job(s, images["trainer"], objects, addresses, job), root / "kube"
        )
        (root / "kube").mkdir()
        kube.start()
        s.kube = kube
        try:
            yield from _start(s, images, objects, addresses)
        finally:
            for process in s.processes.values():
                process.stop(20)
            kube.stop()


def _start(
    s: Stack, images: dict[str, Image], objects: Objects, addresses: dict[str, str]
) -> Iterator[Stack]:
    volumes = {"model": s.model.parent}
    registry = _pod(
        s.rendered,
        "registry",
        images["registry"],
        objects,
        addresses,
        "PREFT_REGISTRY_PORT",
        False,
        s.ports["registry"],
        volumes,
        s.root / "pods",
        [REDIS, S3_SERVICE],
    )
    # What the kubelet adds to every pod of a namespace with API access: the API's address
    # and (automountServiceAccountToken) the service account's credentials.
    assert s.kube is not None
    registry.env |= {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(s.kube.port),
    }
    registry.extra_mounts.append(
        (s.kube.service_account("llm"), "/var/run/secrets/kubernetes.io/serviceaccount")
    )
    worker = _pod(
        s.rendered,
        "worker",
        images["worker-cpu"],
        objects,
        addresses,
        None,
        True,
        s.ports["worker"],
        volumes,
        s.root / "pods",
        [REDIS, S3_SERVICE],
    )
    worker_dns = s.rendered.component("Deployment", "gateway")
    dns_name = {e["name"]: e.get("value") for e in container(worker_dns)["env"]}[
        "PREFT_GATEWAY_WORKER_DNS_NAME"
    ]
    gateway = _pod(
        s.rendered,
        "gateway",
        images["gateway"],
        objects,
        addresses,
        "PREFT_GATEWAY_PORT",
        False,
        s.ports["gateway"],
        volumes,
        s.root / "pods",
        [REDIS, REGISTRY],
        hosts={dns_name: "127.0.0.1"},
    )
    assert gateway.env["PREFT_GATEWAY_WORKER_PORT"] == str(container_port(worker.container, "http"))
    gateway.env["PREFT_GATEWAY_WORKER_PORT"] = str(s.ports["worker"])
    s.pods = {"registry": registry, "worker": worker, "gateway": gateway}
    logs = s.root / "logs"
    for name, pod in s.pods.items():
        s.processes[name] = pod.process(logs, s.url(name)).start()
    for name, path in (("registry", "/healthz"), ("worker", "/health"), ("gateway", "/healthz")):
        s.processes[name].wait_http(path, WORKER_START_TIMEOUT_S)
    yield s


def _run_job(
    s: Stack, image: Image, objects: Objects, addresses: dict[str, str], job: dict[str, Any]
) -> ServiceProcess:
    """The kubelet's part for a Job the registry created: its one container, as sent."""
    spec = job["spec"]["template"]["spec"]
    (trainer,) = spec["containers"]
    env = resolve_env(trainer, objects, {})
    env, _ = substitute(env, addresses)
    name = job["metadata"]["name"]
    pod = Pod(
        name,
        image,
        spec,
        trainer,
        env,
        list(trainer.get("args") or []),
        {"model": s.model.parent},
        workdir=s.root / "pods" / name,
    )
    s.pods[pod.name] = pod
    process = pod.process(s.root / "logs").start()
    s.processes[pod.name] = process
    return process


class _moto:
    """A moto S3 server process (as tests/conftest.py's, but this stack's own)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> str:
        import sys

        from tests.support.ports import wait_for_port

        port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        wait_for_port(port, self.proc, 30)
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)


def tenant(s: Stack, name: str | None = None) -> str:
    reply = httpx.post(
        f"{s.url('registry')}/v1/tenants",
        json={"name": name or f"t{uuid.uuid4().hex[:8]}"},
        headers={"Authorization": f"Bearer {s.admin_token}"},
        timeout=30,
    )
    assert reply.status_code == 201, reply.text
    return str(reply.json()["api_key"])
