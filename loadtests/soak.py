"""Soak with chaos: the whole stack under steady traffic and tenant changes while its parts
are killed, restarted and paused at random; then checks that nothing was lost, no answer
was wrong, every error is accounted for, every fault recovered, and no resource grew.

The stack, each part a process of its own (``preft_serve.onebox`` runs them): an S3
server (moto), Redis with an append-only file fsynced on every write, the registry on that
S3 store, two CPU workers (vLLM, the toy ``tiny-llama``), the gateway in front of both.
Two tenants upload ``--adapters`` LoRA adapters and bind one user to each; then, for
``--minutes``:

* traffic: chat completions (some streamed) for random bound users at ``--load`` (70%) of
  the capacity measured just before (closed loop, 24 clients), arrivals at random (Poisson);
* tenant changes on both tenants at once: uploads of new adapters, new versions of bound
  ones (hot swaps), rebinds of users, deletes of unbound adapters;
* chaos, at random times, one fault at a time, each kind in turn (shuffled rounds): a
  worker SIGKILLed and restarted; the registry SIGKILLed in the middle of an upload and
  restarted; Redis SIGKILLed, down 5 s, restarted from its AOF; the S3 server paused
  (SIGSTOP) for 20 s; a worker paused (SIGSTOP) for 10 s. moto keeps its objects in
  memory, so a killed moto would come back empty (a lost disk, not an outage): "S3 down"
  is a pause, which clients see as a server that accepts connections and does not answer.

At the end it checks, prints as a table and writes to ``--out`` (JSON + a timeline plot):
nothing lost (every acknowledged upload listed, downloadable, its sha256 what was sent;
every acknowledged binding resolves; no referenced blob missing), no wrong answer (another
tenant's adapter, or a version older than one acknowledged before the request was sent,
named by the gateway's ``x-preft-adapter*`` headers), errors accounted for (429, or
502/503 inside a fault's window, with an error envelope; no 500), recovery time per fault,
RSS and open FDs per service. Exit status 1 if any check fails.

    python -m loadtests.soak                 # 20 minutes (make soak)
    python -m loadtests.soak --minutes 3 --adapters 200 --faults-per-kind 1   # the test's
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from loadtests import soak_checks as checks
from loadtests.stack_setup import group_pids, make_adapters, seed_tenants
from preft_serve.adapters.format import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    canonical_config_bytes,
    file_digest,
    read_config,
)
from preft_serve.common import local_redis
from preft_serve.onebox import Child, OneBox, StackConfig, free_port

RESULTS = Path(__file__).parent / "results"
KINDS = ("worker_kill", "registry_kill", "redis_kill", "s3_stop", "worker_stop")
S3_PAUSE_S, WORKER_PAUSE_S, REDIS_DOWN_S = 20.0, 10.0, 5.0
BUCKET = "soak"
# moto accepts any credentials; the children get these, the caller's environment is untouched.
S3_ENV = {"AWS_ACCESS_KEY_ID": "soak", "AWS_SECRET_ACCESS_KEY": "soak",
          "AWS_DEFAULT_REGION": "us-east-1"}
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "seven",
         "wizards", "quietly", "judge", "boxing", "matches", "near", "old", "harbour")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtests.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=20.0, help="soak length (default 20)")
    p.add_argument("--seed", type=int, default=0, help="chaos schedule and traffic mix")
    p.add_argument("--adapters", type=int, default=1000,
                   help="adapters uploaded and bound before the soak (default 1000)")
    p.add_argument("--load", type=float, default=0.7, help="share of measured capacity")
    p.add_argument("--faults-per-kind", type=int, default=0,
                   help="inject exactly this many faults of each kind (0: as many rounds "
                        "as fit)")
    p.add_argument("--mutation-interval", type=float, default=1.5,
                   help="seconds between tenant changes, per tenant (default 1.5)")
    p.add_argument("--grace", type=float, default=5.0,
                   help="seconds a chaos window extends beyond a fault and its recovery")
    p.add_argument("--swap-grace", type=float, default=0.0,
                   help="seconds after a hot swap's 2xx during which an older version still "
                        "counts as right (default 0: none)")
    p.add_argument("--var", type=Path, default=Path("var/soak"))
    p.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    return p.parse_args(argv)


def say(line: str) -> None:
    print(line, flush=True)


# -- the stack: parts that can be killed, paused and restarted ------------------------------

class Part:
    """One service process; every restart logs to ``<name>.<n>.log``."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path,
                 cwd: Path) -> None:
        self.name, self.argv, self.env, self.log_dir, self.cwd = name, argv, env, log_dir, cwd
        self.incarnation = 0
        self.child: Child | None = None

    def start(self) -> Part:
        self.incarnation += 1
        self.child = Child(self.name, self.argv,
                           self.log_dir / f"{self.name}.{self.incarnation}.log",
                           env=self.env, cwd=self.cwd)
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

    def start(self) -> None:
        run = self.var / "run"
        shutil.rmtree(run, ignore_errors=True)
        logs = run / "logs"
        logs.mkdir(parents=True)
        s3_port, redis_port = free_port(), free_port()
        s3_url = f"http://127.0.0.1:{s3_port}"
        config = StackConfig(var=self.var, redis_port=redis_port, registry_port=free_port(),
                             gateway_port=free_port(), object_store=f"s3://{BUCKET}/adapters",
                             s3_endpoint_url=s3_url, worker_args=["--max-num-seqs", "64"])
        local = OneBox(config, say)
        self.admin_token, self.redis_url = local.admin_token, local.redis_url

        def part(name: str, argv: list[str], env: dict[str, str] | None = None) -> Part:
            self.parts[name] = Part(name, argv, {**S3_ENV, **(env or {})}, logs, run).start()
            say(f"  {name}: pid {self.parts[name].pid}")
            return self.parts[name]

        workers = []
        for i in range(2):  # the slowest to start: first, in the background
            port = free_port()
            argv = OneBox(dataclasses.replace(config, worker_port=port)).worker_command(
                self.model)
            cache = argv.index("--adapter-cache-dir") + 1
            argv[cache] = str((run / f"adapter-cache-{i}").resolve())
            # One core each for the model's compute thread (vLLM would bind both to core 0).
            env = ({"VLLM_CPU_OMP_THREADS_BIND": str(i)} if (os.cpu_count() or 1) >= 2
                   else {})
            part(f"worker-{i}", argv, env)
            self.urls[f"worker-{i}"] = f"http://127.0.0.1:{port}"
            workers.append(self.urls[f"worker-{i}"])
        part("s3", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                    str(s3_port)]).wait_ready(lambda: httpx.get(s3_url, timeout=2).status_code < 500, 60)
        self.urls["s3"] = s3_url
        (run / "redis").mkdir()
        part("redis", local_redis.redis_server_argv(
            redis_port, (run / "redis").resolve(), persistent=True)).wait_ready(
            lambda: local_redis.ping(self.redis_url), 30)
        argv, env = local.registry_command(self.model)
        (run / "staging").mkdir()
        part("registry", argv, env).wait_ready(http_ok(f"{local.registry_url}/readyz"), 90)
        self.urls["registry"] = local.registry_url
        for i in range(2):
            self.parts[f"worker-{i}"].wait_ready(http_ok(f"{workers[i]}/health"), 900)
        argv, env = local.gateway_command(self.model, workers)
        part("gateway", argv, env).wait_ready(http_ok(f"{local.gateway_url}/readyz"), 90)
        self.urls["gateway"] = local.gateway_url

    def stop(self) -> None:
        for name in ("gateway", "worker-0", "worker-1", "registry", "redis", "s3"):
            if name in self.parts:
                self.parts[name].stop()

    def store(self) -> Any:
        from preft_serve.common.objectstore import create_object_store

        return create_object_store(f"s3://{BUCKET}/adapters", endpoint_url=self.urls["s3"],
                                   region="us-east-1", access_key_id="soak",
                                   secret_access_key="soak")


# -- what everyone records ------------------------------------------------------------------

class Journal:
    """Thread-safe lists of records; times are seconds since ``t0``."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.mutations: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.shed = 0

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def add(self, kind: str, record: dict[str, Any]) -> None:
        with self.lock:
            getattr(self, kind).append(record)


def _body(reply: httpx.Response) -> Any:
    try:
        return reply.json()
    except ValueError:
        return None


# -- traffic ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Client:
    tenant: int
    api_key: str
    user: str


async def one_request(http: httpx.AsyncClient, gateway: str, c: Client, rng: random.Random,
                      journal: Journal, sink: list[dict[str, Any]]) -> None:
    stream = rng.random() < 0.3
    body: dict[str, Any] = {
        "user": c.user, "temperature": 0, "ignore_eos": True, "max_tokens": rng.randint(4, 16),
        "messages": [{"role": "user", "content": " ".join(
            rng.choice(WORDS) for _ in range(rng.randint(4, 24)))}]}
    if stream:
        body["stream"] = True
    rec: dict[str, Any] = {"k": "chat", "t0": journal.now(), "tenant": c.tenant,
                           "user": c.user, "status": 0, "err": None, "shape_ok": None,
                           "stream": stream}
    try:
        async with http.stream("POST", f"{gateway}/v1/chat/completions", json=body,
                               headers={"Authorization": f"Bearer {c.api_key}"}) as reply:
            rec["status"] = reply.status_code
            rec["name"] = reply.headers.get("x-preft-adapter")
            version = reply.headers.get("x-preft-adapter-version")
            rec["version"] = int(version) if version else None
            rec["sha"] = reply.headers.get("x-preft-adapter-sha256")
            raw = await reply.aread()
            if reply.status_code != 200:
                with contextlib.suppress(ValueError):
                    payload = json.loads(raw)
                    rec["shape_ok"] = checks.error_shape_ok(payload)
                    rec["msg"] = str(payload["error"]["message"])[:200]
                rec["shape_ok"] = bool(rec["shape_ok"])
            elif stream:
                if b'"error"' in raw or b"data: [DONE]" not in raw:
                    rec["err"] = "broken_stream"
                    rec["msg"] = raw[-200:].decode(errors="replace")
            elif not (json.loads(raw).get("choices")):
                rec["err"] = "no_choices"
    except Exception as exc:  # noqa: BLE001 (a broken answer is a result, not a crash)
        rec["err"] = type(exc).__name__
    rec["t1"] = journal.now()
    sink.append(rec)


async def _closed_loop(gateway: str, clients: list[Client], seconds: float, concurrency: int,
                       journal: Journal, sink: list[dict[str, Any]]) -> None:
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(
            max_connections=concurrency)) as http:
        async def loop(i: int) -> None:
            rng = random.Random(i)
            while time.monotonic() < end:
                await one_request(http, gateway, rng.choice(clients), rng, journal, sink)
        await asyncio.gather(*(loop(i) for i in range(concurrency)))


def measure_capacity(gateway: str, clients: list[Client], seconds: float) -> float:
    """Successful requests/s with 24 clients sending back to back (after a 5 s warm-up)."""
    journal = Journal()
    warm: list[dict[str, Any]] = []
    asyncio.run(_closed_loop(gateway, clients, 5, 24, journal, warm))
    done: list[dict[str, Any]] = []
    start = journal.now()
    asyncio.run(_closed_loop(gateway, clients, seconds, 24, journal, done))
    span = journal.now() - start
    good = sum(1 for r in done if checks.ok(r["status"]) and not r["err"])
    return good / span


async def _open_loop(gateway: str, clients: list[Client], rate: float, stop: threading.Event,
                     rng: random.Random, journal: Journal, max_inflight: int = 96) -> None:
    sink: list[dict[str, Any]] = []
    tasks: set[asyncio.Task[None]] = set()
    async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=10), limits=httpx.Limits(
            max_connections=max_inflight)) as http:
        due = time.monotonic()
        while not stop.is_set():
            due += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if len(tasks) >= max_inflight:
                journal.shed += 1  # the client's own cap, not the service's refusal
                continue
            task = asyncio.create_task(one_request(http, gateway, rng.choice(clients),
                                                   random.Random(rng.random()), journal, sink))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            while sink:
                journal.add("requests", sink.pop())
        if tasks:
            await asyncio.wait(tasks, timeout=150)
        for rec in sink:
            journal.add("requests", rec)


# -- tenant changes --------------------------------------------------------------------------

class Tenants:
    """The tenants' side: seeded adapters, fresh content for uploads and new versions."""

    def __init__(self, registry: str, keys: list[str], seeded: list[dict[str, Any]],
                 pool: list[Path]) -> None:
        self.registry, self.keys = registry, keys
        self.seeded = seeded
        self.pool = pool
        self.lock = threading.Lock()
        self.bound_names = {t: [s["name"] for s in seeded if s["tenant"] == t]
                            for t in range(len(keys))}
        self.users = {t: [s["user"] for s in seeded if s["tenant"] == t]
                      for t in range(len(keys))}
        self.unbound: dict[int, list[str]] = {t: [] for t in range(len(keys))}
        self.seq = 0

    def fresh(self) -> Path | None:
        with self.lock:
            return self.pool.pop() if self.pool else None

    def headers(self, tenant: int) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    def upload(self, tenant: int, name: str, folder: Path, journal: Journal,
               new_version: bool = False, body: Callable[[bytes], Any] | None = None
               ) -> dict[str, Any]:
        """POST (or PUT: a hot swap) ``folder`` as ``name``; the record has the sha256
        computed here, so the checks compare it with what the store holds."""
        config = canonical_config_bytes(read_config(folder))
        sha = file_digest(config, folder / WEIGHTS_FILE)
        files = [("files", (n, (folder / n).read_bytes(), "application/octet-stream"))
                 for n in (CONFIG_FILE, WEIGHTS_FILE)]
        method, url = (("PUT", f"{self.registry}/v1/adapters/{name}") if new_version
                       else ("POST", f"{self.registry}/v1/adapters"))
        data = {"mode": "prefill"} if new_version else {"name": name, "mode": "prefill"}
        request = httpx.Request(method, url, data=data, files=files,
                                headers=self.headers(tenant))
        content = request.read()
        rec: dict[str, Any] = {"k": "swap" if new_version else "upload", "tenant": tenant,
                               "name": name, "sha": sha, "status": 0, "t0": journal.now()}
        try:
            reply = httpx.request(method, url, headers=dict(request.headers), timeout=60,
                                  content=body(content) if body else content)
            rec["status"] = reply.status_code
            payload = _body(reply)
            if reply.status_code == 201 and isinstance(payload, dict):
                rec["version"], rec["sha_reply"] = payload["version"], payload["sha256"]
            else:
                rec["shape_ok"] = checks.error_shape_ok(payload)
        except httpx.HTTPError as exc:
            rec["err_detail"] = type(exc).__name__
        rec["t1"] = journal.now()
        journal.add("mutations", rec)
        return rec

    def call(self, kind: str, tenant: int, method: str, path: str, journal: Journal,
             **fields: Any) -> dict[str, Any]:
        rec: dict[str, Any] = {"k": kind, "tenant": tenant, "status": 0, "t0": journal.now(),
                               **fields}
        body = {"adapter": fields["name"]} if kind == "bind" else None
        try:
            reply = httpx.request(method, f"{self.registry}{path}", json=body, timeout=30,
                                  headers=self.headers(tenant))
            rec["status"] = reply.status_code
            if not checks.ok(reply.status_code):
                rec["shape_ok"] = checks.error_shape_ok(_body(reply))
        except httpx.HTTPError as exc:
            rec["err_detail"] = type(exc).__name__
        rec["t1"] = journal.now()
        journal.add("mutations", rec)
        return rec

    def change(self, tenant: int, rng: random.Random, journal: Journal) -> None:
        """One random change: upload 35%, hot swap 30%, rebind 20%, delete 15%."""
        roll = rng.random()
        with self.lock:
            self.seq += 1
            seq = self.seq
        if roll < 0.35 or (roll >= 0.85 and not self.unbound[tenant]):
            if (folder := self.fresh()) is not None:
                name = f"n{tenant}-{seq:05d}"
                if checks.ok(self.upload(tenant, name, folder, journal)["status"]):
                    self.unbound[tenant].append(name)
        elif roll < 0.65:
            if (folder := self.fresh()) is not None:
                self.upload(tenant, rng.choice(self.bound_names[tenant]), folder, journal,
                            new_version=True)
        elif roll < 0.85:
            user = rng.choice(self.users[tenant])
            if self.unbound[tenant] and rng.random() < 0.5:
                name = self.unbound[tenant].pop(rng.randrange(len(self.unbound[tenant])))
                self.bound_names[tenant].append(name)  # never deleted from now on
            else:
                name = rng.choice(self.bound_names[tenant])
            self.call("bind", tenant, "PUT", f"/v1/users/{user}", journal, user=user,
                      name=name)
        else:
            name = self.unbound[tenant].pop(0)
            self.call("delete", tenant, "DELETE", f"/v1/adapters/{name}", journal, name=name)


def change_loop(tenants: Tenants, tenant: int, interval: float, stop: threading.Event,
                seed: int, journal: Journal) -> None:
    rng = random.Random(seed)
    while not stop.wait(rng.uniform(0.5, 1.5) * interval):
        tenants.change(tenant, rng, journal)


# -- chaos ------------------------------------------------------------------------------------

def _poll(check: Callable[[], bool], timeout: float, interval: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return True
        time.sleep(interval)
    return False


class Chaos:
    """Injects faults (on the main thread: restarted processes are its children, and
    ``PR_SET_PDEATHSIG`` fires when the thread that forked them ends) and waits on a
    thread of its own for the first success through the affected part. Faults are
    injected one at a time, but the next one may come while a part is still coming back
    (a killed worker's restart takes minutes); a part that is not back yet gets no new
    fault."""

    def __init__(self, stack: Stack, tenants: Tenants, journal: Journal, rng: random.Random,
                 probe_sha: str) -> None:
        self.stack, self.tenants, self.journal, self.rng = stack, tenants, journal, rng
        self.probe_sha = probe_sha
        self.busy: set[str] = set()  # parts not recovered yet
        self.restarting: set[str] = set()  # killed workers among them
        self.waiting: list[threading.Thread] = []

    def free_part(self, kind: str, stop: threading.Event,
                  deadline: float = float("inf")) -> str | None:
        """The part ``kind`` hits (a worker at random), once no fault is recovering except
        a killed worker's restart, and then not on a worker while the other is down: one
        always serves (both down is an outage by construction, not a finding)."""
        while not stop.is_set() and time.monotonic() < deadline:
            restarting = {p for p in self.busy if p in self.restarting}
            if self.busy <= restarting:
                if kind.startswith("worker"):
                    free = [w for w in ("worker-0", "worker-1") if w not in self.busy]
                    if len(free) == 2:
                        return self.rng.choice(free)
                else:
                    return kind.split("_")[0]
            stop.wait(0.5)
        return None

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.waiting:
            thread.join(max(0.0, deadline - time.monotonic()))

    # Probes: one real operation through the part that failed.
    def _worker_answers(self, worker: str) -> Callable[[], bool]:
        url = self.stack.urls[worker]
        return lambda: httpx.post(f"{url}/v1/completions", timeout=10, json={
            "model": f"sha256:{self.probe_sha}", "prompt": [1, 2, 3], "max_tokens": 2,
            "temperature": 0}).status_code == 200

    def _registry_writes(self) -> bool:
        rec = self.tenants.call("bind", 0, "PUT", "/v1/users/probe", self.journal,
                                user="probe", name=self.tenants.seeded[0]["name"])
        return checks.ok(rec["status"])

    def _s3_writes(self) -> bool:
        folder = self.tenants.fresh()
        if folder is None:
            return self._registry_writes()
        with self.tenants.lock:
            self.tenants.seq += 1
            name = f"n0-{self.tenants.seq:05d}"
        ok = checks.ok(self.tenants.upload(0, name, folder, self.journal)["status"])
        if ok:
            self.tenants.unbound[0].append(name)
        return ok

    def _gateway_serves(self) -> bool:
        user = self.tenants.seeded[0]
        reply = httpx.post(f"{self.stack.urls['gateway']}/v1/chat/completions", timeout=30,
                           headers=self.tenants.headers(0), json={
                               "user": user["user"], "max_tokens": 2,
                               "messages": [{"role": "user", "content": "probe"}]})
        return reply.status_code == 200

    def inject(self, kind: str, part: str) -> None:
        parts = self.stack.parts
        fault: dict[str, Any] = {"kind": kind, "part": part, "start": self.journal.now(),
                                 "url": self.stack.urls.get(part)}
        self.busy.add(part)
        say(f"  [{fault['start']:7.1f} s] fault {kind} on {part}")
        if kind in ("worker_kill", "worker_stop"):
            worker = part
            if kind == "worker_kill":
                self.restarting.add(worker)
                parts[worker].kill()
                fault["end"] = self.journal.now()
                parts[worker].start()
            else:
                parts[worker].signal(signal.SIGSTOP)
                time.sleep(WORKER_PAUSE_S)
                parts[worker].signal(signal.SIGCONT)
                fault["end"] = self.journal.now()
            probe = self._worker_answers(worker)
            timeout = 900.0
        elif kind == "registry_kill":
            fault["upload_in_flight"] = self._kill_mid_upload()
            fault["end"] = self.journal.now()
            parts["registry"].start()
            probe, timeout = self._registry_writes, 120.0
        elif kind == "redis_kill":
            parts["redis"].kill()
            time.sleep(REDIS_DOWN_S)
            fault["end"] = self.journal.now()
            parts["redis"].start()
            probe = lambda: self._registry_writes() and self._gateway_serves()
            timeout = 120.0
        else:
            parts["s3"].signal(signal.SIGSTOP)
            time.sleep(S3_PAUSE_S)
            parts["s3"].signal(signal.SIGCONT)
            fault["end"] = self.journal.now()
            probe, timeout = self._s3_writes, 120.0

        def wait() -> None:
            fault["recovered"] = self.journal.now() if _poll(probe, timeout, 0.5) else None
            self.journal.add("faults", fault)
            self.busy.discard(part)
            self.restarting.discard(part)
            rec = fault["recovered"]
            say(f"  [{self.journal.now():7.1f} s] {kind} on {part}: down "
                f"{fault['end'] - fault['start']:.1f} s, "
                + (f"recovered {rec - fault['end']:.1f} s later" if rec is not None
                   else "NOT recovered"))

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        self.waiting.append(thread)

    def _kill_mid_upload(self) -> dict[str, Any]:
        """Send an upload's first half, SIGKILL the registry, then try to send the rest."""
        half_sent, killed = threading.Event(), threading.Event()

        def slow(content: bytes) -> Iterator[bytes]:
            yield content[: len(content) // 2]
            half_sent.set()
            killed.wait(10)
            yield content[len(content) // 2:]

        folder = self.tenants.fresh()
        result: dict[str, Any] = {}
        if folder is None:
            self.stack.parts["registry"].kill()
            return result
        with self.tenants.lock:
            self.tenants.seq += 1
            name = f"n1-{self.tenants.seq:05d}"
        thread = threading.Thread(target=lambda: result.update(self.tenants.upload(
            1, name, folder, self.journal, body=slow)))
        thread.start()
        half_sent.wait(30)
        time.sleep(0.2)  # the registry is reading the body
        self.stack.parts["registry"].kill()
        killed.set()
        thread.join(90)
        return {"name": name, "status": result.get("status"), "half_sent": half_sent.is_set()}


def chaos_loop(chaos: Chaos, args: argparse.Namespace, end: float, stop: threading.Event,
               rng: random.Random) -> None:
    """Faults one at a time at random gaps, each kind in shuffled rounds, until ``end``
    (the time left must fit the fault) or, with --faults-per-kind, until all are done."""
    expected = {"worker_kill": 90, "worker_stop": 25, "registry_kill": 15, "redis_kill": 15,
                "s3_stop": 30}
    fixed = args.faults_per_kind
    # Fixed: the worker pause first, then the kill, whose minutes of restart the other
    # faults overlap (any worker fault waits for both workers).
    plan: list[str] = ["worker_stop", "worker_kill"] if fixed else []
    for _ in range(fixed or 100):
        round_ = list(KINDS)
        rng.shuffle(round_)
        plan += round_
    if fixed:
        plan.remove("worker_kill")
        plan.remove("worker_stop")
    short = args.minutes <= 5
    for kind in plan:
        gap = rng.uniform(3, 8) if short else rng.uniform(10, 45)
        if not fixed and time.monotonic() + gap + expected[kind] > end:
            break
        deadline = float("inf") if fixed else end - expected[kind]
        if stop.wait(gap) or (part := chaos.free_part(kind, stop, deadline)) is None:
            return
        chaos.inject(kind, part)


# -- resources ------------------------------------------------------------------------------

def sample(stack: Stack, journal: Journal) -> None:
    parts: dict[str, Any] = {}
    for name, part in stack.parts.items():
        rss = fds = 0
        for pid in group_pids(part.pid):
            with contextlib.suppress(OSError, ValueError, IndexError):
                status = Path(f"/proc/{pid}/status").read_text()
                rss += int(next(ln for ln in status.splitlines()
                                if ln.startswith("VmRSS:")).split()[1])
                fds += len(os.listdir(f"/proc/{pid}/fd"))
        parts[name] = {"rss_mb": round(rss / 1024, 1), "fds": fds,
                       "incarnation": part.incarnation}
    journal.add("samples", {"t": journal.now(), "parts": parts})


def monitor(stack: Stack, journal: Journal, stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        sample(stack, journal)
        with journal.lock:
            reqs = list(journal.requests)
        recent = [r for r in reqs if r["t1"] > journal.now() - every]
        good = sum(1 for r in recent if checks.ok(r["status"]) and not r["err"])
        say(f"  [{journal.now():7.1f} s] {len(reqs)} requests ({good / every:.1f} ok/s, "
            f"{len(recent) - good} errors in the last {every:.0f} s), "
            f"{len(journal.mutations)} tenant changes, {len(journal.faults)} faults done")


# -- the end checks ---------------------------------------------------------------------------

def verify_state(stack: Stack, tenants: Tenants, journal: Journal) -> dict[str, Any]:
    """Nothing lost: acknowledged uploads listed and downloadable with the sha256 sent,
    acknowledged bindings resolve, no blob referenced but missing, deletes stay deleted."""
    registry, store = stack.urls["registry"], stack.store()
    http = httpx.Client(timeout=30)
    muts = sorted(journal.mutations, key=lambda m: m["t1"])
    deleted = {(m["tenant"], m["name"]) for m in muts if m["k"] == "delete"
               and checks.ok(m["status"])}
    expected: dict[tuple[int, str], dict[int, str]] = {}
    for s in tenants.seeded:
        expected.setdefault((s["tenant"], s["name"]), {})[1] = s["sha"]
    sha_mismatch = 0
    for m in muts:
        if m["k"] in ("upload", "swap") and m["status"] == 201:
            expected.setdefault((m["tenant"], m["name"]), {})[m["version"]] = m["sha"]
            sha_mismatch += m["sha_reply"] != m["sha"]
    binds: dict[tuple[int, str], str] = {(s["tenant"], s["user"]): s["name"]
                                         for s in tenants.seeded}
    unknown_binds = {(m["tenant"], m["user"]) for m in muts
                     if m["k"] == "bind" and not checks.ok(m["status"])
                     and not 400 <= m["status"] < 500}
    for m in muts:
        if m["k"] == "bind" and checks.ok(m["status"]):
            binds[(m["tenant"], m["user"])] = m["name"]
    out: dict[str, Any] = {"uploads_acknowledged": sum(len(v) for v in expected.values()),
                           "sha_reply_mismatch": sha_mismatch, "not_listed": [],
                           "not_downloadable": [], "deleted_but_listed": [],
                           "bindings_checked": len(binds), "bindings_wrong": [],
                           "blobs_referenced": 0, "blobs_missing": []}
    for (tenant, name), versions in expected.items():
        reply = http.get(f"{registry}/v1/adapters/{name}", headers=tenants.headers(tenant))
        if (tenant, name) in deleted:
            if reply.status_code != 404:
                out["deleted_but_listed"].append([tenant, name, reply.status_code])
            continue
        listed = ({v["version"]: v["sha256"] for v in reply.json()["versions"]}
                  if reply.status_code == 200 else {})
        for version, sha in versions.items():
            if listed.get(version) != sha:
                out["not_listed"].append([tenant, name, version, reply.status_code])
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    store.fetch_adapter(sha, Path(tmp), verify=True)
                except Exception as exc:  # noqa: BLE001 (reported, not raised)
                    out["not_downloadable"].append([sha, type(exc).__name__])
    for (tenant, user), name in binds.items():
        reply = http.get(f"{registry}/v1/users/{user}", headers=tenants.headers(tenant))
        got = reply.json().get("adapter") if reply.status_code == 200 else None
        if got != name and (tenant, user) not in unknown_binds:
            out["bindings_wrong"].append([tenant, user, name, got])
    for tenant in range(len(tenants.keys)):  # every version the registry lists
        cursor: str | None = None
        while True:
            page = http.get(f"{registry}/v1/adapters", headers=tenants.headers(tenant),
                            params={"limit": 1000, **({"cursor": cursor} if cursor else {})})
            page.raise_for_status()
            for item in page.json()["items"]:
                detail = http.get(f"{registry}/v1/adapters/{item['name']}",
                                  headers=tenants.headers(tenant)).json()
                for v in detail["versions"]:
                    out["blobs_referenced"] += 1
                    if not store.has_adapter(v["sha256"]):
                        out["blobs_missing"].append(v["sha256"])
            cursor = page.json()["next_cursor"]
            if not cursor:
                break
    http.close()
    out["lost"] = (len(out["not_listed"]) + len(out["not_downloadable"])
                   + len(out["bindings_wrong"]) + len(out["blobs_missing"])
                   + out["sha_reply_mismatch"])
    return out


def verdicts(args: argparse.Namespace, journal: Journal, state: dict[str, Any],
             tenants: Tenants, end: float) -> dict[str, Any]:
    truth = checks.Truth(journal.mutations, tenants.seeded)
    wrong = checks.wrong_answers(journal.requests, truth, args.swap_grace)
    errors = checks.account_errors([*journal.requests, *journal.mutations], journal.faults,
                                   args.grace, end)
    recovery = checks.recovery(journal.faults)
    resources = checks.resources(journal.samples, journal.faults)
    kinds_seen = set(recovery)
    all_recovered = all(r["recovered"] == r["faults"] for r in recovery.values())
    rows = [
        ("uploads acknowledged: listed, downloadable, sha256 as sent",
         (f"{state['uploads_acknowledged']} checked, "
         f"{len(state['not_listed'])} not listed, {len(state['not_downloadable'])} not "
         f"downloadable, {state['sha_reply_mismatch']} sha256 mismatches"),
         not (state["not_listed"] or state["not_downloadable"] or state["sha_reply_mismatch"])),
        ("acknowledged deletes stay deleted", f"{len(state['deleted_but_listed'])} listed",
         not state["deleted_but_listed"]),
        ("acknowledged bindings resolve", (f"{state['bindings_checked']} checked, "
         f"{len(state['bindings_wrong'])} wrong"), not state["bindings_wrong"]),
        ("no blob referenced but missing", (f"{state['blobs_referenced']} referenced, "
         f"{len(state['blobs_missing'])} missing"), not state["blobs_missing"]),
        ("no wrong answer (tenant, version after swap)",
         f"{wrong['checked']} answers checked, {wrong['wrong']} wrong {wrong['by_kind']}",
         wrong["wrong"] == 0),
        ("zero 500s", f"{errors['classes'].get('http_500', 0)}",
         errors["classes"].get("http_500", 0) == 0),
        ("errors accounted for (429 / 502-503 in a window)",
         f"{errors['classes']}", errors["unaccounted"] == 0),
        ("every fault recovered", ", ".join(
            f"{k} {r['recovered']}/{r['faults']} (max {r['max_s']} s)"
            for k, r in recovery.items()), all_recovered and kinds_seen == set(KINDS)),
        ("resources (RSS MB, FDs: start -> end)", "; ".join(
            f"{p} {r['rss_mb_start']:.0f}->{r['rss_mb_end']:.0f} MB "
            f"{r['fds_start']}->{r['fds_end']} fds"
            + (f" ({r['restarts']} restarts)" if r["restarts"] else "")
            for p, r in resources.items()),
         all(r["rss_growth_same_process"] is None or r["rss_growth_same_process"] < 1.5
             for r in resources.values())),
    ]
    return {"rows": rows, "wrong": wrong, "errors": errors, "recovery": recovery,
            "resources": resources, "passed": all(passed for _, _, passed in rows)}


# -- main -------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from preft_serve.toymodels import make_model  # imports torch

    var = args.var.resolve()
    run_s = args.minutes * 60
    # Fresh content for uploads and new versions: about one per change, plus spare.
    changes = int(2 * run_s / args.mutation_interval) + 50
    say(f"[1/6] model and {args.adapters} + {changes} rank-4 adapters in {var}")
    model = make_model("tiny-llama", var / "model").resolve()
    adapters = make_adapters(model, var / "adapters", args.adapters + changes)
    folders = [f for f, _ in adapters]
    stack = Stack(var, model)
    journal = Journal()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        say("[2/6] stack: s3 (moto), redis (AOF), registry, 2 workers, gateway")
        t = time.monotonic()
        stack.start()
        say(f"  up in {time.monotonic() - t:.0f} s")
        say(f"[3/6] 2 tenants, {args.adapters} uploads and bindings")
        bound = seed_tenants(_StackView(stack), adapters[:args.adapters], 2,  # type: ignore[arg-type]
                             prefix="soak")
        keys = [bound[0].api_key, bound[1].api_key]  # adapter i belongs to tenant i % 2
        seeded: list[dict[str, Any]] = [{"tenant": i % 2, "name": b.adapter, "user": b.user, "sha": b.sha256}
                  for i, b in enumerate(bound)]
        tenants = Tenants(stack.urls["registry"], keys, seeded,
                          list(reversed(folders[args.adapters:])))
        clients = [Client(s["tenant"], keys[s["tenant"]], s["user"]) for s in seeded]
        capacity_s = 10.0 if args.minutes <= 5 else 20.0
        say(f"[4/6] capacity: 24 clients back to back for {capacity_s:.0f} s")
        capacity = measure_capacity(stack.urls["gateway"], clients, capacity_s)
        rate = max(0.5, args.load * capacity)
        say(f"  {capacity:.1f} requests/s; soak at {rate:.1f}/s ({args.load:.0%})")
        say(f"[5/6] soak for {args.minutes:g} min with chaos (seed {args.seed})")
        rng = random.Random(args.seed)
        journal = Journal()
        sample(stack, journal)
        end = time.monotonic() + run_s
        chaos = Chaos(stack, tenants, journal, random.Random(rng.random()), seeded[0]["sha"])
        every = 15.0 if args.minutes <= 5 else 30.0
        threads = [threading.Thread(target=monitor, args=(stack, journal, stop, every),
                                    daemon=True)]
        threads += [threading.Thread(target=change_loop, daemon=True, args=(
            tenants, t, args.mutation_interval, stop, rng.randrange(1 << 30), journal))
            for t in range(2)]
        traffic = threading.Thread(target=lambda: asyncio.run(_open_loop(
            stack.urls["gateway"], clients, rate, stop, random.Random(rng.random()),
            journal)), daemon=True)
        for th in [*threads, traffic]:
            th.start()
        chaos_loop(chaos, args, end, stop, rng)
        while time.monotonic() < end:
            time.sleep(0.5)
        chaos.join(900)  # traffic goes on until every part is back
        stop.set()
        traffic.join(180)
        for th in threads:
            th.join(90)
        sample(stack, journal)
        finished = journal.now()
        say("[6/6] checks: state in the registry and the store, answers, errors")
        state = verify_state(stack, tenants, journal)
        result = verdicts(args, journal, state, tenants, finished)
    finally:
        stop.set()
        stack.stop()
    timeline = checks.bins(journal.requests, finished)
    ok_count = result["errors"]["classes"].get("ok", 0)
    summary = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "config": {k: str(v) for k, v in vars(args).items()},
        "capacity_rps": round(capacity, 2), "target_rps": round(rate, 2),
        "soak_s": finished,
        "requests": len(journal.requests), "client_shed": journal.shed,
        "achieved_ok_rps": round(sum(1 for r in journal.requests
                                     if checks.ok(r["status"]) and not r["err"]) / finished, 2),
        "tenant_changes": dict(_count(m["k"] for m in journal.mutations)),
        "tenant_changes_acknowledged": dict(_count(
            m["k"] for m in journal.mutations if checks.ok(m["status"]))),
        "checks": [{"check": n, "result": r, "pass": p} for n, r, p in result["rows"]],
        "passed": result["passed"],
        "state": state, "wrong_answers": result["wrong"], "errors": result["errors"],
        "recovery": result["recovery"], "resources": result["resources"],
        "faults": journal.faults, "timeline": timeline, "ok_responses_total": ok_count,
        # Every request or change that did not succeed, for a closer look.
        "failures": [r for r in [*journal.requests, *journal.mutations]
                     if not checks.ok(r["status"]) or r.get("err")][:5000],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1))
    checks.plot(timeline, journal.faults,
                f"soak {finished / 60:.1f} min at {rate:.1f} req/s ({args.load:.0%} of "
                f"{capacity:.1f}), {len(journal.faults)} faults: "
                + ("all checks pass" if result["passed"] else "CHECKS FAILED"),
                args.out.with_suffix(".png"))
    say("\n" + checks.table(result["rows"]))
    say(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")
    return 0 if result["passed"] else 1


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


class _StackView:
    """What :func:`loadtests.stack_setup.seed_tenants` needs of a stack."""

    def __init__(self, stack: Stack) -> None:
        self.registry_url, self.admin_token = stack.urls["registry"], stack.admin_token


if __name__ == "__main__":
    # SIGTERM (timeout, a CI runner) stops the stack too, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    raise SystemExit(main())
