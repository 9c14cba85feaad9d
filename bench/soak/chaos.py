"""Faults at random times, one at a time: kills, restarts and pauses of the stack's parts,
each followed by a probe through the part until it serves again."""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from bench.soak.churn import Tenants
from bench.soak.finetune import TERMINAL, FineTuning, trainers
from bench.soak.journal import Journal, say
from bench.soak.processes import Stack
from bench.soak.verify import KINDS, ok

S3_PAUSE_S, WORKER_PAUSE_S, REDIS_DOWN_S = 20.0, 10.0, 5.0
REGISTERING_S = 2.5  # after the trainer's output is stored: the registry is registering it


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

    def __init__(
        self,
        stack: Stack,
        tenants: Tenants,
        ft: FineTuning,
        journal: Journal,
        rng: random.Random,
        probe_sha: str,
    ) -> None:
        self.stack, self.tenants, self.journal, self.rng = stack, tenants, journal, rng
        self.ft = ft
        self.probe_sha = probe_sha
        self.busy: set[str] = set()  # parts not recovered yet
        self.restarting: set[str] = set()  # killed workers among them
        self.waiting: list[threading.Thread] = []

    def free_part(
        self, kind: str, stop: threading.Event, deadline: float = float("inf")
    ) -> str | None:
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
        return lambda: (
            httpx.post(
                f"{url}/v1/completions",
                timeout=10,
                json={
                    "model": f"sha256:{self.probe_sha}",
                    "prompt": [1, 2, 3],
                    "max_tokens": 2,
                    "temperature": 0,
                },
            ).status_code
            == 200
        )

    def _registry_writes(self) -> bool:
        rec = self.tenants.call(
            "bind",
            0,
            "PUT",
            "/v1/users/probe",
            self.journal,
            user="probe",
            name=self.tenants.seeded[0]["name"],
        )
        return ok(rec["status"])

    def _s3_writes(self) -> bool:
        folder = self.tenants.fresh()
        if folder is None:
            return self._registry_writes()
        with self.tenants.lock:
            self.tenants.seq += 1
            name = f"n0-{self.tenants.seq:05d}"
        uploaded = ok(self.tenants.upload(0, name, folder, self.journal)["status"])
        if uploaded:
            self.tenants.unbound[0].append(name)
        return uploaded

    def _registry_and_gateway(self) -> bool:
        return self._registry_writes() and self._gateway_serves()

    def _gateway_serves(self) -> bool:
        user = self.tenants.seeded[0]
        reply = httpx.post(
            f"{self.stack.urls['gateway']}/v1/chat/completions",
            timeout=30,
            headers=self.tenants.headers(0),
            json={
                "user": user["user"],
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "probe"}],
            },
        )
        return reply.status_code == 200

    def inject(self, kind: str, part: str) -> None:
        parts = self.stack.parts
        fault: dict[str, Any] = {
            "kind": kind,
            "part": part,
            "start": self.journal.now(),
            "url": self.stack.urls.get(part),
        }
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
            probe, timeout = self._registry_and_gateway, 120.0
        elif kind == "trainer_kill":
            fault["job"] = job = self._kill_trainer()
            fault["start"] = fault["end"] = self.journal.now()  # after the hunt for one
            probe, timeout = self._job_ended(fault, job), 120.0
        elif kind == "registry_kill_registering":
            fault.update(self._kill_registering())
            fault["end"] = self.journal.now()
            parts["registry"].start()
            ended = self._job_ended(fault, fault.get("job"))
            probe, timeout = (lambda: ended() and self._registry_writes()), 180.0
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
            say(
                f"  [{self.journal.now():7.1f} s] {kind} on {part}: down "
                f"{fault['end'] - fault['start']:.1f} s, "
                + (
                    f"recovered {rec - fault['end']:.1f} s later"
                    if rec is not None
                    else "NOT recovered"
                )
            )

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        self.waiting.append(thread)

    def _job_ended(self, fault: dict[str, Any], job: str | None) -> Callable[[], bool]:
        """A probe: the job the fault hit has ended (its final status goes to the fault)."""

        def ended() -> bool:
            seen: dict[str, Any] | None = (
                self.ft.status(job) if job is not None else {"status": "none"}
            )
            if seen is None or seen["status"] not in (*TERMINAL, "none"):
                return False
            fault["job_status"] = seen["status"]
            fault["job_error"] = (seen.get("error") or {}).get("code")
            return True

        return ended

    def _running_trainer(self, timeout: float = 180) -> tuple[int, str] | None:
        """A trainer process and its job, once one runs (the tenant keeps jobs coming)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := trainers(self.ft.jobs):
                pid = self.rng.choice(sorted(found))
                return pid, found[pid]
            time.sleep(0.2)
        return None

    def _kill_trainer(self) -> str | None:
        """SIGKILL a training process (its own session: the whole group)."""
        found = self._running_trainer()
        if found is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(found[0], signal.SIGKILL)
        return found[1]

    def _kill_registering(self) -> dict[str, Any]:
        """Kill the registry while it registers a finished trainer's adapter: the moment a
        trainer exits with its whole output stored, pause S3 (the registration reads that
        output back from S3, so it blocks there), give the registry time to see the exit
        and start registering, then SIGKILL the registry and resume S3."""
        from preft_serve.registry.finetune.spec import OUTPUT_FILES, output_prefix

        store = self.stack.store()

        def stored(job: str) -> bool:
            with contextlib.suppress(Exception):
                return all(store.exists(output_prefix(job) + n) for n in OUTPUT_FILES)
            return False

        deadline = time.monotonic() + 600  # a job takes minutes on a busy machine
        watched: dict[int, str] = {}
        paused_at: float | None = None  # the fault starts at the first pause, not the hunt
        while time.monotonic() < deadline:
            running = trainers(self.ft.jobs)
            job = next((j for pid, j in watched.items() if pid not in running and stored(j)), None)
            watched = running
            if job is None:
                time.sleep(0.02)
                continue
            # The restarted registry must register it: the churn's cancel would win instead.
            self.ft.spare(job)
            s3 = self.stack.parts["s3"]
            s3.signal(signal.SIGSTOP)
            paused_at = self.journal.now() if paused_at is None else paused_at
            time.sleep(REGISTERING_S)
            seen = self.ft.status(job)  # the job's record is in Redis: readable now
            if seen is None or seen["status"] != "running":  # registered before the pause
                s3.signal(signal.SIGCONT)
                continue
            self.stack.parts["registry"].kill()
            s3.signal(signal.SIGCONT)
            # The registry died before it recorded the job's success.
            return {"job": job, "start": paused_at, "status_at_kill": seen["status"]}
        self.stack.parts["registry"].kill()
        return {"job": None, **({"start": paused_at} if paused_at is not None else {})}

    def _kill_mid_upload(self) -> dict[str, Any]:
        """Send an upload's first half, SIGKILL the registry, then try to send the rest."""
        half_sent, killed = threading.Event(), threading.Event()

        def slow(content: bytes) -> Iterator[bytes]:
            yield content[: len(content) // 2]
            half_sent.set()
            killed.wait(10)
            yield content[len(content) // 2 :]

        folder = self.tenants.fresh()
        result: dict[str, Any] = {}
        if folder is None:
            self.stack.parts["registry"].kill()
            return result
        with self.tenants.lock:
            self.tenants.seq += 1
            name = f"n1-{self.tenants.seq:05d}"
        thread = threading.Thread(
            target=lambda: result.update(
                self.tenants.upload(1, name, folder, self.journal, body=slow)
            )
        )
        thread.start()
        half_sent.wait(30)
        time.sleep(0.2)  # the registry is reading the body
        self.stack.parts["registry"].kill()
        killed.set()
        thread.join(90)
        return {"name": name, "status": result.get("status"), "half_sent": half_sent.is_set()}


def chaos_loop(
    chaos: Chaos, args: argparse.Namespace, end: float, stop: threading.Event, rng: random.Random
) -> None:
    """Faults one at a time at random gaps, each kind in shuffled rounds, until ``end``
    (the time left must fit the fault) or, with --faults-per-kind, until all are done."""
    expected = {
        "worker_kill": 90,
        "worker_stop": 25,
        "registry_kill": 15,
        "redis_kill": 15,
        "s3_stop": 30,
        "trainer_kill": 30,
        "registry_kill_registering": 60,
    }
    fixed = args.faults_per_kind
    # Fixed: the worker pause first, then the kill, whose minutes of restart the other
    # faults overlap (any worker fault waits for both workers).
    plan: list[str] = []
    for i in range(fixed or 100):
        round_ = list(KINDS)
        rng.shuffle(round_)
        if fixed and i == 0:
            first = ["worker_stop", "worker_kill"]
            round_ = first + [k for k in round_ if k not in first]
        plan += round_
    short = args.minutes <= 5
    for kind in plan:
        gap = rng.uniform(3, 8) if short else rng.uniform(10, 45)
        if not fixed and time.monotonic() + gap + expected[kind] > end:
            break
        deadline = float("inf") if fixed else end - expected[kind]
        if stop.wait(gap) or (part := chaos.free_part(kind, stop, deadline)) is None:
            return
        chaos.inject(kind, part)
