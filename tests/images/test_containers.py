"""The chart's containers started from the built images as rendered (conftest.py says what
is remapped and why): their probes answer, an adapter uploaded to the registry pod and bound
to a user gives, through the gateway pod and the worker pod, the greedy tokens of the
HF+peft oracle, and a fine-tuning job runs as the Job the registry creates, from the trainer
image, and registers its adapter."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from preft_serve.adapters.format import AdapterMode
from preft_serve.toymodels import LoraSpec, make_lora_adapter
from tests.chart.manifests import container_port
from tests.images.conftest import BUILD_TIMEOUT_S, IMAGES, MODEL_NAME, Stack, tenant
from tests.images.pods import Pod

# Whichever test runs first builds the images (the session fixture) inside its own timeout.
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 600)

MAX_TOKENS = 12
QUESTION = [{"role": "user", "content": "hello there, who are you?"}]
FACTS = {"What is my pet's name?": "Biscuit", "Where do I live?": "Lisbon"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_make_images_built_every_image_as_the_chart_runs_it(
    built_images: dict[str, Any], stack: Stack
) -> None:
    """Each image: non-root uid 10001 (the pods' runAsUser) and a size in the report."""
    assert set(built_images["images"]) == set(IMAGES)
    for name, item in built_images["images"].items():
        assert item["size_bytes"] > 100e6, (name, item)
        config = json.loads(
            subprocess.run(
                ["buildah", "inspect", "--type", "image", item["tag"]],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )["OCIv1"]["config"]
        assert config["User"] == "10001:10001", name
    for component in ("registry", "worker", "gateway"):
        assert stack.pods[component].user() == (10001, 10001)


def _probe_ok(pod: Pod, port: int, probe: dict[str, Any]) -> int:
    get = probe["httpGet"]
    assert container_port(pod.container, get["port"]) > 0
    try:
        return httpx.get(
            f"http://127.0.0.1:{port}{get['path']}", timeout=probe.get("timeoutSeconds", 5)
        ).status_code
    except httpx.HTTPError:
        return 0


@pytest.mark.parametrize("component", ["registry", "worker", "gateway"])
def test_probes_answer_on_the_running_containers(stack: Stack, component: str) -> None:
    """The rendered startup, readiness and liveness probes (path and named port) answer
    200 on the running container, within the time the probe's thresholds allow."""
    pod = stack.pods[component]
    probes = {
        kind: pod.container[kind]
        for kind in ("startupProbe", "readinessProbe", "livenessProbe")
        if kind in pod.container
    }
    assert {"readinessProbe", "livenessProbe"} <= set(probes), component
    for kind, probe in probes.items():
        allowed = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
        deadline = time.monotonic() + allowed
        while (code := _probe_ok(pod, stack.ports[component], probe)) != 200:
            assert time.monotonic() < deadline, (
                component,
                kind,
                probe,
                code,
                stack.processes[component].log_tail(),
            )
            time.sleep(1)


@pytest.fixture(scope="module")
def adapter(stack: Stack) -> Path:
    root = stack.root / "adapters"
    return make_lora_adapter(
        stack.model, root / "lora", seed=41, spec=LoraSpec(rank=8, mode=AdapterMode.PREFILL)
    )


def chat(stack: Stack, key: str, **who: str) -> dict[str, Any]:
    body = {
        "model": MODEL_NAME,
        "messages": QUESTION,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        **who,
    }
    reply = httpx.post(
        f"{stack.url('gateway')}/v1/chat/completions", json=body, headers=bearer(key), timeout=120
    )
    assert reply.status_code == 200, reply.text
    answer: dict[str, Any] = reply.json()
    return answer


def test_chat_through_the_containers_equals_the_oracle(stack: Stack, adapter: Path) -> None:
    """Upload (registry pod, S3) -> bind -> chat through the gateway pod to the worker pod,
    which fetches the adapter from S3: the HF+peft oracle's greedy tokens, adapter and base."""
    from tests.engine import oracle

    key = tenant(stack)
    files = [
        ("files", (p.name, p.read_bytes(), "application/octet-stream"))
        for p in sorted(adapter.iterdir())
        if p.is_file()
    ]
    reply = httpx.post(
        f"{stack.url('registry')}/v1/adapters",
        headers=bearer(key),
        data={"name": "bot", "mode": "prefill"},
        files=files,
        timeout=60,
    )
    assert reply.status_code == 201, reply.text
    reply = httpx.put(
        f"{stack.url('registry')}/v1/users/u1",
        json={"adapter": "bot"},
        headers=bearer(key),
        timeout=30,
    )
    assert reply.status_code == 200, reply.text

    adapted = chat(stack, key, user="u1")
    base = chat(stack, key)
    prompt = adapted["prompt_token_ids"]
    assert base["prompt_token_ids"] == prompt
    got = {"prefill": adapted["choices"][0]["token_ids"], "base": base["choices"][0]["token_ids"]}
    want = {
        "prefill": oracle.generate_prefill(stack.model, adapter, prompt, MAX_TOKENS),
        "base": oracle.generate_base(stack.model, prompt, MAX_TOKENS),
    }
    assert got == want
    assert got["prefill"] != got["base"]  # or the comparison would prove nothing
    assert adapted["model"] == "bot"


def test_fine_tuning_job_runs_as_the_registry_creates_it(stack: Stack) -> None:
    """OpenAI's fine-tuning API on the gateway pod -> the registry pod creates a batch/v1
    Job through the Kubernetes API (its own manifest code, in-cluster credentials) -> the
    Job's container runs from the trainer image as sent (read-only root, /tmp emptyDir,
    the model volume) -> the adapter it wrote to S3 is validated and registered, and a
    user bound to it is served by the worker pod."""
    assert stack.kube is not None
    key = tenant(stack)
    gateway = stack.url("gateway")
    lines = "".join(
        json.dumps(
            {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        )
        + "\n"
        for q, a in FACTS.items()
    )
    reply = httpx.post(
        f"{gateway}/v1/files",
        headers=bearer(key),
        data={"purpose": "fine-tune"},
        files={"file": ("facts.jsonl", lines.encode(), "application/jsonl")},
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    method = {
        "type": "preft",
        "preft": {"adapter": "lora", "mode": "prefill", "rank": 4, "steps": 2},
    }
    reply = httpx.post(
        f"{gateway}/v1/fine_tuning/jobs",
        headers=bearer(key),
        timeout=60,
        json={
            "model": MODEL_NAME,
            "training_file": reply.json()["id"],
            "suffix": "facts",
            "method": method,
        },
    )
    assert reply.status_code == 200, reply.text
    job_id = reply.json()["id"]
    deadline = time.monotonic() + 300
    while (
        job := httpx.get(
            f"{gateway}/v1/fine_tuning/jobs/{job_id}", headers=bearer(key), timeout=30
        ).json()
    )["status"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(2)
    (run,) = stack.kube.jobs.values()
    trainer = stack.pods[run.manifest["metadata"]["name"]]
    assert job["status"] == "succeeded", (job, stack.processes[trainer.name].log_tail())
    assert job["fine_tuned_model"] == "facts"
    assert not stack.kube.unexpected and not stack.kube.unauthorised
    # The Job's container as the registry built it: the trainer image's entry point,
    # a read-only root with /tmp writable.
    assert trainer.container["command"] == ["python3", "-m", "preft_serve.registry.finetune.entry"]
    assert trainer.read_only_root() and set(trainer.writable) == {"/tmp"}
    assert trainer.user() == (10001, 10001)  # the image's USER: the Job sets no runAsUser

    reply = httpx.get(f"{stack.url('registry')}/v1/adapters/facts", headers=bearer(key), timeout=30)
    assert reply.status_code == 200, reply.text
    reply = httpx.put(
        f"{stack.url('registry')}/v1/users/u-ft",
        json={"adapter": "facts"},
        headers=bearer(key),
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    served = chat(stack, key, user="u-ft")
    assert served["model"] == "facts"
    assert len(served["choices"][0]["token_ids"]) == MAX_TOKENS


@pytest.mark.parametrize("component", ["registry", "gateway", "worker"])
def test_root_filesystem_is_read_only_where_the_chart_says(stack: Stack, component: str) -> None:
    """The pods really run read-only: writing outside the chart's mounts fails (EROFS),
    inside an emptyDir mount it works (the worker's HOME is one: vLLM, torch, Triton and
    Hugging Face write their caches there)."""
    pod = stack.pods[component]
    assert pod.read_only_root()
    probe = Pod(
        f"{component}-check",
        pod.image,
        pod.pod_spec,
        {**pod.container, "command": ["python3", "-c"]},
        pod.env,
        [
            "import os, sys\n"
            "for path in sys.argv[1:]:\n"
            "    try:\n"
            "        open(os.path.join(path, 'probe'), 'w').close(); print(path, 'ok')\n"
            "    except OSError as e:\n"
            "        print(path, e.errno)\n",
            "/home/app",
            "/opt/venv",
            "/tmp",
        ],
        pod.volumes,
        workdir=stack.root / "pods" / f"{component}-check",
    )
    process = probe.process(stack.root / "logs").start()
    assert process.proc is not None
    process.proc.wait(60)
    lines = process.log_tail().split()
    want = [
        item
        for path in ("/home/app", "/opt/venv", "/tmp")
        for item in (path, "ok" if path in pod.writable else "30")
    ]
    assert lines[-6:] == want, lines
    assert "/tmp" in pod.writable and "/opt/venv" not in pod.writable
