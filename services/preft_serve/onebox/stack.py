"""Start and stop the four processes of a local stack: Redis, registry, worker, gateway.

Each part runs exactly as in production (``python -m preft_serve.registry`` and friends,
configured by flags and ``PREFT_*`` variables), so ``make run`` also checks those entry
points. State lives under ``<var>/run/``: logs in ``logs/``, the filesystem object store in
``objects/`` (unless an S3 URL is given), the worker's adapter cache, Redis's directory.
"""

from __future__ import annotations

import dataclasses
import secrets
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import redis

from preft_serve.common.local_redis import redis_server_argv
from preft_serve.common.rank_caps import RANK_CAPS
from preft_serve.onebox.processes import Child, StackError, port_in_use

Say = Callable[[str], None]
STOP_ORDER = ("gateway", "worker", "registry", "redis")


@dataclasses.dataclass
class StackConfig:
    """Where the stack keeps its state and which loopback ports it uses."""

    var: Path = Path("var")
    redis_port: int = 6380
    registry_port: int = 8081
    worker_port: int = 8001
    gateway_port: int = 8080
    object_store: str | None = None  # default: <var>/run/objects
    s3_endpoint_url: str | None = None
    base_model_name: str = "tiny-llama"
    kv_cache_gib: float = 0.25
    max_model_len: int = 1024
    max_lora_rank: int = RANK_CAPS.max_lora_rank  # given to the registry and the worker
    worker_args: list[str] = dataclasses.field(default_factory=list)
    gateway_env: dict[str, str] = dataclasses.field(default_factory=dict)
    worker_env: dict[str, str] = dataclasses.field(default_factory=dict)  # e.g. step trace
    worker_timeout_s: float = 600.0
    service_timeout_s: float = 60.0
    stop_timeout_s: float = 30.0

    @property
    def run_dir(self) -> Path:
        return self.var / "run"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def store_url(self) -> str:
        return self.object_store or str((self.run_dir / "objects").resolve())

    @property
    def ports(self) -> dict[str, int]:
        return {
            "--redis-port": self.redis_port,
            "--registry-port": self.registry_port,
            "--worker-port": self.worker_port,
            "--gateway-port": self.gateway_port,
        }


def http_ok(url: str) -> Callable[[], bool]:
    """A readiness check for :meth:`Child.wait_ready`: ``url`` answers 200."""
    return lambda: httpx.get(url, timeout=2.0).status_code == 200


class OneBox:
    """The running parts; :meth:`stop` stops them in dependency order."""

    def __init__(self, config: StackConfig, say: Say = print) -> None:
        self.config, self.say = config, say
        self.admin_token = secrets.token_urlsafe(24)
        self.children: list[Child] = []
        self.model: Path | None = None

    # URLs of the parts (valid once started).
    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.config.redis_port}/0"

    @property
    def registry_url(self) -> str:
        return f"http://127.0.0.1:{self.config.registry_port}"

    @property
    def worker_url(self) -> str:
        return f"http://127.0.0.1:{self.config.worker_port}"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.config.gateway_port}"

    def check_ports(self) -> None:
        """Fail before starting anything if a port is taken (a stack already running?)."""
        busy = [f"{port} ({flag})" for flag, port in self.config.ports.items() if port_in_use(port)]
        if busy:
            raise StackError(
                f"port(s) already in use: {', '.join(busy)}. Is another local "
                "stack running? Stop it, or choose other ports with those flags."
            )

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        """Start one more part (stopped with the others; unknown names stop first)."""
        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        child = Child(
            name, argv, self.config.log_dir / f"{name}.log", env=env, cwd=self.config.run_dir
        )
        self.children.append(child)
        self.say(f"  {name}: started (pid {child.pid}), log {child.log_path}")
        return child

    def start_redis(self) -> Child:
        """Redis with an append-only file, like the chart's: a Redis restart during the run
        keeps every tenant, adapter and binding. Each run starts from an empty one (the
        demo creates its tenant afresh)."""
        data = self.config.run_dir / "redis"
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True, exist_ok=True)
        try:
            argv = redis_server_argv(self.config.redis_port, data.resolve(), persistent=True)
        except FileNotFoundError as exc:
            raise StackError(str(exc)) from None
        child = self.start("redis", argv)
        client = redis.Redis.from_url(self.redis_url, socket_timeout=1)
        child.wait_ready(lambda: bool(client.ping()), self.config.service_timeout_s, 0.05)
        client.close()
        return child

    def registry_command(self, model: Path) -> tuple[list[str], dict[str, str]]:
        env = {
            "PREFT_REGISTRY_ADMIN_TOKEN": self.admin_token,
            "PREFT_REGISTRY_STAGING_DIR": str((self.config.run_dir / "staging").resolve()),
            "PREFT_REGISTRY_MAX_LORA_RANK": str(self.config.max_lora_rank),
            # The gateway's --base-model-name: fine-tuning accepts the name /v1/models lists.
            "PREFT_REGISTRY_BASE_MODEL_NAME": self.config.base_model_name,
        }
        if self.config.s3_endpoint_url:
            env["PREFT_REGISTRY_OBJECT_STORE__S3_ENDPOINT_URL"] = self.config.s3_endpoint_url
        if self.config.store_url.startswith("s3://"):
            # A fresh MinIO/moto has no bucket yet; an existing one is left as it is.
            env["PREFT_REGISTRY_OBJECT_STORE__S3_CREATE_BUCKET"] = "true"
        argv = [
            sys.executable,
            "-m",
            "preft_serve.registry",
            "--port",
            str(self.config.registry_port),
            "--base-model",
            str(model),
            "--redis-url",
            self.redis_url,
            "--object-store",
            self.config.store_url,
        ]
        return argv, env

    def start_registry(self, model: Path) -> Child:
        (self.config.run_dir / "staging").mkdir(parents=True, exist_ok=True)
        argv, env = self.registry_command(model)
        child = self.start("registry", argv, env)
        child.wait_ready(http_ok(f"{self.registry_url}/readyz"), self.config.service_timeout_s)
        return child

    def worker_command(
        self, model: Path, port: int | None = None, cache_dir: Path | None = None
    ) -> list[str]:
        """The worker's command line; benchmarks with more workers give each its own
        ``port`` and adapter ``cache_dir``."""
        cache_dir = cache_dir or self.config.run_dir / "adapter-cache"
        argv = [
            sys.executable,
            "-m",
            "preft_serve.worker.serve",
            "--model",
            str(model),
            "--port",
            str(port or self.config.worker_port),
            "--object-store",
            self.config.store_url,
            "--adapter-cache-dir",
            str(cache_dir.resolve()),
            "--adapter-cache-gib",
            "1",
            "--kv-cache-gib",
            str(self.config.kv_cache_gib),
            "--max-model-len",
            str(self.config.max_model_len),
            "--max-lora-rank",
            str(self.config.max_lora_rank),
        ]
        if self.config.s3_endpoint_url:
            argv += ["--s3-endpoint-url", self.config.s3_endpoint_url]
        return argv + self.config.worker_args

    def start_worker(self, model: Path) -> Child:
        """Start the worker without waiting: vLLM takes a while, other parts start meanwhile."""
        self.model = model
        return self.start("worker", self.worker_command(model), self.config.worker_env or None)

    def wait_worker(self) -> float:
        worker = next(c for c in self.children if c.name == "worker")
        return worker.wait_ready(
            http_ok(f"{self.worker_url}/health"), self.config.worker_timeout_s, 0.5
        )

    def gateway_command(
        self, model: Path, worker_urls: list[str] | None = None, port: int | None = None
    ) -> tuple[list[str], dict[str, str]]:
        argv = [
            sys.executable,
            "-m",
            "preft_serve.gateway",
            "--port",
            str(port or self.config.gateway_port),
            "--redis-url",
            self.redis_url,
            "--workers",
            ",".join(worker_urls or [self.worker_url]),
            "--base-model-name",
            self.config.base_model_name,
            "--worker-base-model",
            str(model),
            "--registry-url",
            self.registry_url,
        ]
        # One machine, one operator: the gateway gets the admin token for its read-only
        # operator routes (the console's operator view).
        env = {"PREFT_GATEWAY_DISCOVERY": "static", "PREFT_GATEWAY_ADMIN_TOKEN": self.admin_token}
        return argv, {**env, **self.config.gateway_env}

    def start_gateway(
        self,
        model: Path,
        worker_urls: list[str] | None = None,
        port: int | None = None,
        name: str = "gateway",
        extra_env: dict[str, str] | None = None,
    ) -> Child:
        """A gateway in front of ``worker_urls`` (default: this stack's worker); benchmarks
        start a second one on another ``port`` under another ``name`` (``extra_env``: e.g.
        another ``PYTHONPATH``, to run an older version side by side)."""
        port = port or self.config.gateway_port
        argv, env = self.gateway_command(model, worker_urls, port)
        child = self.start(name, argv, {**env, **(extra_env or {})})
        child.wait_ready(http_ok(f"http://127.0.0.1:{port}/readyz"), self.config.service_timeout_s)
        return child

    def dead_child(self) -> Child | None:
        """The first part that has exited on its own, if any."""
        return next((c for c in self.children if not c.running()), None)

    def stop(self) -> None:
        """Stop every started part, users before what they use: gateway, worker, registry,
        Redis (the worker starts first only because it takes longest)."""
        self.children.sort(key=lambda c: STOP_ORDER.index(c.name) if c.name in STOP_ORDER else -1)
        while self.children:
            child = self.children.pop(0)
            was_running = child.running()
            code = child.stop(self.config.stop_timeout_s)
            state = "stopped" if was_running else f"had already exited ({code})"
            self.say(f"  {child.name}: {state}")
