"""The local backend: each job's trainer is a child process of the registry, at most
``workers`` at once. Each runs in its own process group (a cancel kills the trainer and
anything it started), prints progress lines to a pipe the runner reads, and writes stderr
to a log file in its scratch directory whose tail explains a crash.

A child is identified by pid and kernel start time (``/proc/<pid>/stat``), so a
restarted registry never kills an unrelated process that reused the pid.

Every trainer is bounded from its first instruction (:class:`TrainerLimits`, set with
``prlimit`` right after the fork, before the interpreter has loaded anything): its data
segment (what torch allocates), the largest file it may write and its CPU seconds; each
poll also reads its resident memory and stops one that passed the limit. A trainer that
hits a limit fails its job with a reason naming the setting; nothing else on the host is
touched.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

from preft_serve.common.objectstore import ObjectStoreKind, ObjectStoreSettings, parse_store_url
from preft_serve.registry.finetune.runners.base import Observation, Runner, RunState, parse_line
from preft_serve.registry.finetune.spec import TrainerSpec

logger = logging.getLogger(__name__)
_LOG = "trainer.log"
_OUT_OF_MEMORY = (
    "MemoryError",
    "can't allocate memory",
    "Cannot allocate memory",
    "std::bad_alloc",
)


@dataclasses.dataclass(frozen=True)
class TrainerLimits:
    """What one local trainer may use; a job's failure states the limit it hit (its
    value, never the setting's name: the reason reaches the tenant)."""

    memory_bytes: int
    file_bytes: int
    cpu_seconds: int

    def apply(self, pid: int) -> None:
        for kind, value in (
            (resource.RLIMIT_DATA, self.memory_bytes),
            (resource.RLIMIT_FSIZE, self.file_bytes),
            (resource.RLIMIT_CPU, self.cpu_seconds),
        ):
            resource.prlimit(pid, kind, (value, value))

    def memory_reason(self) -> str:
        return (
            f"the trainer went over its memory limit of {self.memory_bytes >> 20} MiB; "
            "lower batch_size or max_seq_len"
        )

    def signal_reason(self, signo: int) -> str | None:
        if signo == signal.SIGXCPU:
            return (
                f"the trainer used its {self.cpu_seconds} CPU seconds; lower steps or "
                "use a smaller training file"
            )
        if signo == signal.SIGXFSZ:
            return f"the trainer wrote a file over its limit of {self.file_bytes >> 20} MiB"
        return None


def resident_bytes(pid: int) -> int:
    """Resident memory of ``pid`` (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may hold spaces, so split after its ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def store_env(
    store: ObjectStoreSettings, prefix: str = "PREFT_TRAINER_OBJECT_STORE__"
) -> dict[str, str]:
    """The object-store settings as the trainer's environment (a local path made absolute,
    since the trainer runs in its own directory)."""
    url = store.url
    kind, location = parse_store_url(url)
    if kind is ObjectStoreKind.LOCAL:
        url = str(Path(location).resolve())
    env = {f"{prefix}URL": url, f"{prefix}LOCAL_CREATE_ROOT": "false"}
    for field in ("s3_endpoint_url", "s3_region", "s3_access_key_id"):
        if (value := getattr(store, field)) is not None:
            env[prefix + field.upper()] = str(value)
    if store.s3_secret_access_key is not None:
        env[prefix + "S3_SECRET_ACCESS_KEY"] = store.s3_secret_access_key.get_secret_value()
    return env


class _Child:
    def __init__(self, proc: subprocess.Popen[bytes], work: Path) -> None:
        self.proc, self.work = proc, work
        self.lines: collections.deque[dict[str, Any]] = collections.deque()
        self.last_error: str | None = None
        self.over_memory = False
        self.reader = threading.Thread(
            target=self._read, args=(proc.stdout,), daemon=True, name=f"trainer-{proc.pid}"
        )
        self.reader.start()

    def _read(self, stream: IO[bytes] | None) -> None:
        assert stream is not None
        for raw in iter(stream.readline, b""):
            line = parse_line(raw.decode("utf-8", "replace"))
            if line is not None:
                if line.get("preft_event") == "error":
                    self.last_error = str(line.get("message", ""))
                self.lines.append(line)
        stream.close()

    def drain(self) -> list[dict[str, Any]]:
        out = []
        while self.lines:
            out.append(self.lines.popleft())
        return out

    def log_tail(self, chars: int = 600) -> str:
        try:
            text = (self.work / _LOG).read_text(errors="replace")
        except OSError:
            return ""
        return text[-chars:].strip()


class LocalRunner(Runner):
    name = "local"
    stops_with_registry = True

    def __init__(
        self,
        workers: int,
        store: ObjectStoreSettings,
        instance: str,
        work_dir: Path | None,
        limits: TrainerLimits,
    ) -> None:
        self.workers, self.instance, self.work_dir = workers, instance, work_dir
        self.limits = limits
        self.env = store_env(store)
        self.host = socket.gethostname()
        self.children: dict[str, _Child] = {}
        self.lock = threading.Lock()

    def capacity(self) -> int:
        with self.lock:
            running = sum(1 for c in self.children.values() if c.proc.poll() is None)
        return max(0, self.workers - running)

    def start(self, spec: TrainerSpec, tenant: str) -> dict[str, Any]:
        work = Path(tempfile.mkdtemp(prefix=f"preft-{spec.job_id}-", dir=self.work_dir))
        # The registry's own settings (its admin token among them) stay with the registry.
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("PREFT_REGISTRY_")}
        env = {
            **inherited,
            **self.env,
            "PREFT_TRAINER_SPEC": spec.model_dump_json(),
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        with open(work / _LOG, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "preft_serve.registry.finetune.entry"],
                env=env,
                cwd=work,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        try:
            self.limits.apply(proc.pid)
        except OSError:
            _kill_group(proc)
            raise
        with self.lock:
            self.children[spec.job_id] = _Child(proc, work)
        logger.info("job %s: trainer pid %d in %s", spec.job_id, proc.pid, work)
        return {
            "backend": self.name,
            "instance": self.instance,
            "host": self.host,
            "pid": proc.pid,
            "pid_start": process_start(proc.pid),
        }

    def poll(self, job_id: str, runner: dict[str, Any]) -> Observation:
        with self.lock:
            child = self.children.get(job_id)
        if child is None:
            return Observation(
                RunState.FAILED,
                reason="the trainer process is not known to this registry (it was restarted)",
            )
        code = child.proc.poll()
        if code is None and resident_bytes(child.proc.pid) > self.limits.memory_bytes:
            child.over_memory = True
            _kill_group(child.proc)
            code = child.proc.poll()
        if code is None:
            return Observation(RunState.RUNNING, child.drain())
        child.reader.join(10)  # every line it printed, before judging the exit
        lines = child.drain()
        self._forget(job_id)
        if code == 0:
            return Observation(RunState.SUCCEEDED, lines)
        detail = child.last_error or child.log_tail()
        limit = self._limit_reason(child, code, detail)
        if limit is not None:
            return Observation(RunState.FAILED, lines, reason=limit)
        if code < 0:
            why = f"the trainer process was killed by {signal.Signals(-code).name}"
        else:
            why = f"the trainer exited with status {code}"
        return Observation(RunState.FAILED, lines, reason=f"{why}: {detail}" if detail else why)

    def _limit_reason(self, child: _Child, code: int, detail: str) -> str | None:
        """The limit a failed trainer ran into, if any (said without its log's paths)."""
        if child.over_memory or any(mark in detail for mark in _OUT_OF_MEMORY):
            return self.limits.memory_reason()
        return self.limits.signal_reason(-code) if code < 0 else None

    def cancel(self, job_id: str, runner: dict[str, Any]) -> None:
        with self.lock:
            child = self.children.get(job_id)
        if child is not None:
            _kill_group(child.proc)
            self._forget(job_id)
        elif runner.get("host") == self.host:
            self._kill_recorded(runner)

    def orphan(self, job_id: str, runner: dict[str, Any]) -> str | None:
        if runner.get("host") != self.host:
            return (
                f"the registry that ran this job (on {runner.get('host')}) stopped; its "
                "trainer cannot report back"
            )
        killed = self._kill_recorded(runner)
        state = "was stopped" if killed else "had already exited"
        return f"the registry that ran this job stopped; its trainer process {state}"

    def _kill_recorded(self, runner: dict[str, Any]) -> bool:
        pid = runner.get("pid")
        if not isinstance(pid, int) or process_start(pid) != runner.get("pid_start"):
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
            return True
        return False

    def _forget(self, job_id: str) -> None:
        with self.lock:
            child = self.children.pop(job_id, None)
        if child is not None:
            shutil.rmtree(child.work, ignore_errors=True)

    def close(self) -> None:
        with self.lock:
            children = list(self.children.items())
        for job_id, child in children:
            _kill_group(child.proc)
            self._forget(job_id)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the trainer's process group, SIGKILL what is left after 3 s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(3)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
