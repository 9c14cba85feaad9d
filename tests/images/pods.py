"""Run a rendered Kubernetes container from a built image's root filesystem, the way a
kubelet would start it, without a container runtime (none works on these hosts).

What is taken from the rendered manifest, unchanged: command and args, env (secrets,
ConfigMaps and ``$(VAR)`` references resolved as the kubelet does), volume mounts (each
emptyDir a fresh directory, or a fresh tmpfs for ``medium: Memory``), the user (the pod's
runAsUser/runAsGroup, else the image's USER) and readOnlyRootFilesystem. What is not
Kubernetes: every pod shares the host's network, so the caller remaps listening ports
and service addresses to loopback ports (:func:`substitute`) and says where.

Mechanics: ``unshare -m`` (a private mount namespace), the image rootfs bind-mounted and
remounted read-only, /proc, /sys, /dev and a pod-private /dev/shm, the pod's volumes and
/etc/hosts, then ``chroot --userspec`` and ``env -i`` with exactly the container's env.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.processes import ServiceProcess, service

_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass
class Image:
    """A built image's writable working copy (``buildah from``) and its config."""

    name: str
    container: str  # buildah working container id
    rootfs: Path  # its mount point
    env: dict[str, str]
    user: str
    workdir: str

    @classmethod
    def mount(cls, name: str) -> Image:
        ctr = _out(["buildah", "from", "--pull-never", name])
        rootfs = Path(_out(["buildah", "mount", ctr]))
        config = json.loads(_out(["buildah", "inspect", "--type", "image", name]))
        oci = config["OCIv1"]["config"]
        env = dict(item.split("=", 1) for item in oci.get("Env") or [])
        return cls(name, ctr, rootfs, env, oci.get("User") or "0", oci.get("WorkingDir") or "/")

    def remove(self) -> None:
        subprocess.run(["buildah", "rm", self.container], capture_output=True, check=False)

    def home_of(self, uid: int) -> str:
        """HOME as the runtime sets it when the env has none: the user's passwd entry."""
        for line in (self.rootfs / "etc" / "passwd").read_text().splitlines():
            fields = line.split(":")
            if len(fields) > 5 and fields[2] == str(uid):
                return fields[5]
        return "/"


def inside(root: Path, path: str) -> Path:
    """``path`` in the tree at ``root``, symlinks resolved within it (Debian's /var/run is
    a link to /run: followed from the host, a mount point would land outside the image)."""
    current = root
    parts = [p for p in path.split("/") if p]
    hops = 0
    while parts:
        part = parts.pop(0)
        candidate = current / part
        if candidate.is_symlink():
            hops += 1
            assert hops < 40, f"symlink loop under {root}: {path}"
            link = str(candidate.readlink())
            parts = [p for p in link.split("/") if p] + parts
            if link.startswith("/"):
                current = root
            continue
        current = (
            root
            if part == ".." and current == root
            else (current.parent if part == ".." else candidate)
        )
    return current


def _out(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


@dataclass
class Objects:
    """The Secrets and ConfigMaps a pod's env can name: rendered ones plus those the
    operator creates before installing (existingSecret values)."""

    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def from_manifests(
        cls, docs: list[dict[str, Any]], extra_secrets: Mapping[str, dict[str, str]]
    ) -> Objects:
        found = cls(secrets={k: dict(v) for k, v in extra_secrets.items()})
        for doc in docs:
            name = doc["metadata"]["name"]
            if doc["kind"] == "Secret":
                data = {k: base64.b64decode(v).decode() for k, v in (doc.get("data") or {}).items()}
                found.secrets[name] = {**data, **(doc.get("stringData") or {})}
            elif doc["kind"] == "ConfigMap":
                found.config_maps[name] = dict(doc.get("data") or {})
        return found


def resolve_env(
    container: dict[str, Any], objects: Objects, fields: Mapping[str, str]
) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom first, then env in
    order, ``$(VAR)`` expanded from what came before."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        if "configMapRef" in source:
            env.update(objects.config_maps[source["configMapRef"]["name"]])
        else:
            env.update(objects.secrets[source["secretRef"]["name"]])
    for item in container.get("env") or []:
        if "value" in item:
            value = _REF.sub(lambda m: env.get(m.group(1), m.group(0)), str(item["value"]))
        elif "secretKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["secretKeyRef"]
            value = objects.secrets[ref["name"]][ref["key"]]
        elif "configMapKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["configMapKeyRef"]
            value = objects.config_maps[ref["name"]][ref["key"]]
        else:
            value = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        env[item["name"]] = value
    return env


def substitute(
    values: Mapping[str, str] | list[str], replacements: Mapping[str, str]
) -> tuple[Any, set[str]]:
    """Replace each key of ``replacements`` (a service address or a listening port) in
    env values or args; returns the new values and the keys that matched."""
    used: set[str] = set()

    def sub(text: str) -> str:
        for old, new in replacements.items():
            if old in text:
                used.add(old)
                text = text.replace(old, new)
        return text

    if isinstance(values, list):
        return [sub(v) for v in values], used
    return {k: sub(v) for k, v in values.items()}, used


@dataclass
class Pod:
    """One container of a rendered pod, ready to start from ``image``."""

    name: str
    image: Image
    pod_spec: dict[str, Any]
    container: dict[str, Any]
    env: dict[str, str]
    args: list[str]
    volumes: dict[str, Path]  # pod volume name -> host directory for non-emptyDir volumes
    hosts: dict[str, str] = field(default_factory=dict)  # name -> address, as cluster DNS
    extra_mounts: list[tuple[Path, str]] = field(default_factory=list)  # read-only
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pod-")))
    # ^ its mount point, start script, /etc/hosts and emptyDir directories
    writable: dict[str, Path] = field(default_factory=dict)  # mountPath -> fresh host dir

    def user(self) -> tuple[int, int]:
        ctx = {
            **(self.pod_spec.get("securityContext") or {}),
            **(self.container.get("securityContext") or {}),
        }
        image_uid, _, image_gid = self.image.user.partition(":")
        uid = int(ctx.get("runAsUser", image_uid or 0))
        gid = int(ctx.get("runAsGroup", image_gid or uid))
        return uid, gid

    def read_only_root(self) -> bool:
        ctx = self.container.get("securityContext") or {}
        return bool(ctx.get("readOnlyRootFilesystem", False))

    def script(self) -> str:
        """The shell run inside ``unshare -m``: mounts, then the container's program."""
        uid, gid = self.user()
        root = self.workdir / "root"
        root.mkdir(parents=True, exist_ok=True)
        q = shlex.quote
        lines = [
            "set -eu",
            f"R={q(str(root))}",
            f'mount --bind {q(str(self.image.rootfs))} "$R"',
            'mount -t proc proc "$R/proc"',
            'mount --rbind /sys "$R/sys"',
            'mount --rbind /dev "$R/dev"',
            'mount -t tmpfs -o size=64m,mode=1777 shm "$R/dev/shm"',
        ]
        volumes = {v["name"]: v for v in self.pod_spec.get("volumes") or []}

        def target_of(path: str) -> str:
            relative = inside(self.image.rootfs, path).relative_to(self.image.rootfs)
            return f'"$R"/{q(str(relative))}'

        for mount in self.container.get("volumeMounts") or []:
            path, volume = mount["mountPath"], volumes[mount["name"]]
            target = target_of(path)
            lines.append(f"mkdir -p {target}")  # the runtime creates missing mount points
            if "emptyDir" in volume:
                if (volume["emptyDir"] or {}).get("medium") == "Memory":
                    lines.append(f"mount -t tmpfs -o mode=1777 tmpfs {target}")
                    continue
                host = self.workdir / "volumes" / mount["name"]
                host.mkdir(parents=True, exist_ok=True)
                host.chmod(0o777)  # emptyDir: writable by the pod's fsGroup
                self.writable[path] = host
                source = str(host)
            else:
                source = str(self.volumes[mount["name"]])
            lines.append(f"mount --bind {q(source)} {target}")
            if mount.get("readOnly"):
                lines.append(f"mount -o remount,bind,ro {target}")
        for host_path, path in self.extra_mounts:
            target = target_of(path)
            lines += [
                f"mkdir -p {target}",
                f"mount --bind {q(str(host_path))} {target}",
                f"mount -o remount,bind,ro {target}",
            ]
        hosts = self.workdir / "hosts"
        hosts.write_text(
            "127.0.0.1 localhost\n"
            + "".join(f"{address} {name}\n" for name, address in self.hosts.items())
        )
        lines.append(f'mount --bind {q(str(hosts))} "$R/etc/hosts"')
        lines.append('mount --bind /etc/resolv.conf "$R/etc/resolv.conf"')
        if self.read_only_root():
            lines.append('mount -o remount,bind,ro "$R"')
        env = {"HOME": self.image.home_of(uid), **self.image.env, "HOSTNAME": self.name, **self.env}
        argv = [*(self.container.get("command") or []), *self.args]
        lines.append(
            f'exec chroot --userspec={uid}:{gid} --groups={gid} "$R" /usr/bin/env -i '
            f"-C {q(self.container.get('workingDir') or self.image.workdir)} "
            + " ".join(q(f"{k}={v}") for k, v in env.items())
            + " "
            + " ".join(q(a) for a in argv)
        )
        return "\n".join(lines) + "\n"

    def process(self, logs: Path, url: str = "") -> ServiceProcess:
        script = self.workdir / "start.sh"
        script.write_text(self.script())
        return service(
            self.name,
            ["unshare", "--mount", "--propagation", "private", "sh", str(script)],
            logs,
            url=url,
        )
