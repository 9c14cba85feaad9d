"""The stack, one process group per part, so that chaos can kill, pause and restart each
part on its own; and the sampler of their RSS and open file descriptors."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.soak.journal import Journal, say
from bench.soak.verify import ok
from bench.stack_setup import group_pids
from preft_serve.common import local_redis
from preft_serve.onebox import Child, OneBox, StackConfig, free_port

BUCKET = "soak"
# moto accepts any credentials; the children get these, the caller's environment is untouched.
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "soak",
    "AWS_SECRET_ACCESS_KEY": "soak",
    "AWS_DEFAULT_REGION": "us-east-1",
}

# A stalled upload is cut off after 10 s (30 s by default), so that the soak's hostile
# tenant sees that happen within each of its 30 s windows.
GATEWAY_ENV = {"PREFT_GATEWAY_UPLOAD_IDLE_TIMEOUT_S": "10"}


class Part:
    """One service process; every restart logs to ``<name>.<n>.log``."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], log_dir: Path, cwd: Path
    ) -> None:
        self.name, self.argv, self.env, self.log_dir, self.cwd = name, argv, env, log_dir, cwd
        self.incarnation = 0
        self.child: Child | None = None

    def start(self) -> Part:
        self.incarnation += 1
        self.child = Child(
            self.name,
            self.argv,
            self.log_dir / f"{self.name}.{self.incarnation}.log",
            env=self.env,
            cwd=self.cwd,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.child is not None
        return self.child.pid

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole group (vLLM's engine core too) and reap it."""
        self.signal(signal.SIGKILL)
        assert self.child is not None
        self.child.proc.wait(30)
        deadline = time.monotonic() + 10
        while group_pids(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def wait_ready(self, check: Callable[[], bool], timeout: float) -> float:
        assert self.child is not None
        return self.child.wait_ready(check, timeout, 0.1)

    def stop(self) -> None:
        if self.child is not None:
            self.signal(signal.SIGCONT)
            self.child.stop(20)


def http_ok(url: str) -> Callable[[], bool]:
    return lambda: httpx.get(url, timeout=2).status_code == 200


@dataclasses.dataclass
class Stack:
    var: Path
    model: Path
    parts: dict[str, Part] = dataclasses.field(default_factory=dict)
    urls: dict[str, str] = dataclasses.field(default_factory=dict)
    admin_token: str = ""
    redis_url: str = ""
    base_model_name: str = ""  # what clients and fine-tuning jobs call the base model

    def start(self) -> None:
        run = self.var / "run"
        shutil.rmtree(run, ignore_errors=True)
        logs = run / "logs"
        logs.mkdir(parents=True)
        s3_port, redis_port = free_port(), free_port()
        s3_url = f"http://127.0.0.1:{s3_port}"
        config = StackConfig(
            var=self.var,
            redis_port=redis_port,
            registry_port=free_port(),
            gateway_port=free_port(),
            object_store=f"s3://{BUCKET}/adapters",
            s3_endpoint_url=s3_url,
            worker_args=["--max-num-seqs", "64"],
        )
        local = OneBox(config, say)
        self.admin_token, self.redis_url = local.admin_token, local.redis_url
        self.base_model_name = config.base_model_name

        def part(name: str, argv: list[str], env: dict[str, str] | None = None) -> Part:
            self.parts[name] = Part(name, argv, {**S3_ENV, **(env or {})}, logs, run).start()
            say(f"  {name}: pid {self.parts[name].pid}")
            return self.parts[name]

        workers = []
        for i in range(2):  # the slowest to start: first, in the background
            port = free_port()
            argv = OneBox(dataclasses.replace(config, worker_port=port)).worker_command(self.model)
            cache = argv.index("--adapter-cache-dir") + 1
            argv[cache] = str((run / f"adapter-cache-{i}").resolve())
            # One core each for the model's compute thread (vLLM would bind both to core 0).
            env = {"VLLM_CPU_OMP_THREADS_BIND": str(i)} if (os.cpu_count() or 1) >= 2 else {}
            part(f"worker-{i}", argv, env)
            self.urls[f"worker-{i}"] = f"http://127.0.0.1:{port}"
            workers.append(self.urls[f"worker-{i}"])
        part(
            "s3", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)]
        ).wait_ready(lambda: httpx.get(s3_url, timeout=2).status_code < 500, 60)
        self.urls["s3"] = s3_url
        (run / "redis").mkdir()
        part(
            "redis",
            local_redis.redis_server_argv(redis_port, (run / "redis").resolve(), persistent=True),
        ).wait_ready(lambda: local_redis.ping(self.redis_url), 30)
        argv, env = local.registry_command(self.model)
        (run / "staging").mkdir()
        part("registry", argv, env).wait_ready(http_ok(f"{local.registry_url}/readyz"), 90)
        self.urls["registry"] = local.registry_url
        for i in range(2):
            self.parts[f"worker-{i}"].wait_ready(http_ok(f"{workers[i]}/health"), 900)
        argv, env = local.gateway_command(self.model, workers)
        part("gateway", argv, {**env, **GATEWAY_ENV}).wait_ready(
            http_ok(f"{local.gateway_url}/readyz"), 90
        )
        self.urls["gateway"] = local.gateway_url

    def stop(self) -> None:
        for name in ("gateway", "worker-0", "worker-1", "registry", "redis", "s3"):
            if name in self.parts:
                self.parts[name].stop()

    def store(self) -> Any:
        from preft_serve.common.objectstore import create_object_store

        return create_object_store(
            f"s3://{BUCKET}/adapters",
            endpoint_url=self.urls["s3"],
            region="us-east-1",
            access_key_id="soak",
            secret_access_key="soak",
        )


class StackView:
    """What :func:`bench.stack_setup.seed_tenants` needs of a stack."""

    def __init__(self, stack: Stack) -> None:
        self.registry_url, self.admin_token = stack.urls["registry"], stack.admin_token


def rss_kb(status: str) -> int:
    """VmRSS from a /proc/<pid>/status text; 0 where there is none (a process that became
    a zombie since it was listed, a kernel thread)."""
    line = next((ln for ln in status.splitlines() if ln.startswith("VmRSS:")), None)
    return int(line.split()[1]) if line else 0


def sample(stack: Stack, journal: Journal) -> None:
    parts: dict[str, Any] = {}
    for name, part in stack.parts.items():
        rss = fds = 0
        for pid in group_pids(part.pid):
            with contextlib.suppress(OSError, ValueError, IndexError):
                rss += rss_kb(Path(f"/proc/{pid}/status").read_text())
                fds += len(os.listdir(f"/proc/{pid}/fd"))
        parts[name] = {"rss_mb": round(rss / 1024, 1), "fds": fds, "incarnation": part.incarnation}
    journal.add("samples", {"t": journal.now(), "parts": parts})


def monitor(stack: Stack, journal: Journal, stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        sample(stack, journal)
        with journal.lock:
            reqs = list(journal.requests)
        recent = [r for r in reqs if r["t1"] > journal.now() - every]
        good = sum(1 for r in recent if ok(r["status"]) and not r["err"])
        say(
            f"  [{journal.now():7.1f} s] {len(reqs)} requests ({good / every:.1f} ok/s, "
            f"{len(recent) - good} errors in the last {every:.0f} s), "
            f"{len(journal.mutations)} tenant changes, {len(journal.faults)} faults done"
        )
