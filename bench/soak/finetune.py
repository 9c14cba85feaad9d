"""Fine-tuning during the soak: one tenant keeps jobs coming (short trainings on the toy
model), cancels some, and at the end every acknowledged job must have ended, every
succeeded job's adapter must be listed and served, and no trainer output may stay behind.

Jobs are the registry's most stateful work: a trainer process outside the registry, a
record in Redis, outputs in the object store, then a registration. The chaos kills each
of those parts while jobs run (see :mod:`bench.soak.chaos`)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
from collections.abc import Container
from pathlib import Path
from typing import Any

import httpx

from bench.soak.churn import Tenants
from bench.soak.journal import Journal, say
from bench.soak.verify import error_shape_ok, ok

TERMINAL = ("succeeded", "failed", "cancelled")
TRAINER_MODULE = b"preft_serve.registry.finetune.entry"
FACTS = {
    "What is my pet's name?": "Biscuit",
    "Where do I live?": "Lisbon",
    "What do I drink?": "Tea",
}


def training_data() -> bytes:
    return "".join(
        json.dumps(
            {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        )
        + "\n"
        for q, a in FACTS.items()
    ).encode()


def trainers(jobs: Container[str]) -> dict[int, str]:
    """Running trainer processes of ``jobs`` (the soak's own): pid -> the job id in their
    spec. Other trainers on the machine (another test's, one without a spec) are not the
    soak's to kill or watch."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            if TRAINER_MODULE not in Path(f"/proc/{entry}/cmdline").read_bytes():
                continue
            if Path(f"/proc/{entry}/stat").read_text().split(") ")[1][0] == "Z":
                continue
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            spec = next((v for v in env if v.startswith(b"PREFT_TRAINER_SPEC=")), None)
            if spec is None:
                continue
            job = json.loads(spec.split(b"=", 1)[1])["job_id"]
            if job in jobs:
                found[int(entry)] = job
    return found


class FineTuning:
    """Tenant ``tenant``'s jobs: created, followed, cancelled, and a small file uploaded and
    deleted at every move, all through the gateway (``api``: its URL; the registry's when
    unset), as an OpenAI client would. Every such call is journaled as a tenant change
    (``ft_file``, ``ft_file_delete``, ``ft_create``, ``ft_get``, ``ft_cancel``) for the
    error accounting. The chaos and the final checks read jobs from the registry itself
    (:meth:`status`), so that what they observe does not depend on the gateway."""

    def __init__(
        self,
        tenants: Tenants,
        tenant: int,
        base_model: str,
        journal: Journal,
        rng: random.Random,
        steps: tuple[int, ...] = (10, 20, 40, 200),
        api: str | None = None,
    ) -> None:
        self.tenants, self.tenant, self.base_model = tenants, tenant, base_model
        self.api = api or tenants.registry
        self.steps = steps  # a job's length is one of these, at random
        self.journal, self.rng = journal, rng
        self.file_id: str | None = None
        self.jobs: dict[str, dict[str, Any]] = {}  # acknowledged: id -> what we know
        self.lock = threading.Lock()
        self.seq = 0

    def _call(self, kind: str, method: str, path: str, **kwargs: Any) -> tuple[dict[str, Any], Any]:
        rec: dict[str, Any] = {
            "k": kind,
            "tenant": self.tenant,
            "status": 0,
            "t0": self.journal.now(),
        }
        payload: Any = None
        try:
            reply = httpx.request(
                method,
                f"{self.api}{path}",
                timeout=30,
                headers=self.tenants.headers(self.tenant),
                **kwargs,
            )
            rec["status"] = reply.status_code
            with contextlib.suppress(ValueError):
                payload = reply.json()
            if not ok(reply.status_code):
                rec["shape_ok"] = error_shape_ok(payload)
                with contextlib.suppress(TypeError, KeyError):
                    rec["code"] = payload["error"]["code"]
                    rec["msg"] = str(payload["error"]["message"])[:200]
        except httpx.HTTPError as exc:
            rec["err_detail"] = type(exc).__name__
        rec["t1"] = self.journal.now()
        self.journal.add("mutations", rec)
        return rec, payload

    def upload_data(self, timeout: float = 60) -> None:
        """The training file all jobs use (before the chaos starts)."""
        deadline = time.monotonic() + timeout
        while self.file_id is None:
            rec, body = self._call(
                "ft_file",
                "POST",
                "/v1/files",
                data={"purpose": "fine-tune"},
                files={"file": ("facts.jsonl", training_data(), "application/jsonl")},
            )
            if ok(rec["status"]):
                self.file_id = body["id"]
            elif time.monotonic() > deadline:
                raise RuntimeError(f"the training file was not accepted: {rec}")
            else:
                time.sleep(1)

    def create(self) -> str | None:
        with self.lock:
            self.seq += 1
            suffix = f"ft-{self.seq:04d}"
        steps = self.rng.choice(self.steps)
        rec, body = self._call(
            "ft_create",
            "POST",
            "/v1/fine_tuning/jobs",
            json={
                "model": self.base_model,
                "training_file": self.file_id,
                "suffix": suffix,
                "seed": self.seq,
                "method": {"type": "preft", "preft": {"steps": steps}},
            },
        )
        if not ok(rec["status"]) or not isinstance(body, dict):
            return None
        # One job in five is cancelled, queued or training, some seconds after its creation.
        cancel_at = rec["t1"] + self.rng.uniform(1, 40) if self.rng.random() < 0.2 else None
        with self.lock:
            self.jobs[body["id"]] = {
                "suffix": suffix,
                "steps": steps,
                "status": "queued",
                "created": rec["t1"],
                "cancel_at": cancel_at,
            }
        return str(body["id"])

    def cancel(self, job_id: str) -> None:
        rec, _ = self._call("ft_cancel", "POST", f"/v1/fine_tuning/jobs/{job_id}/cancel")
        rec["job"] = job_id
        if ok(rec["status"]):
            with self.lock:
                self.jobs[job_id]["cancel_acknowledged"] = rec["t1"]

    def file_round_trip(self) -> None:
        """Upload a small training file and delete it again: a tenant's files calls."""
        rec, body = self._call(
            "ft_file",
            "POST",
            "/v1/files",
            data={"purpose": "fine-tune"},
            files={"file": ("check.jsonl", training_data(), "application/jsonl")},
        )
        if ok(rec["status"]) and isinstance(body, dict):
            self._call("ft_file_delete", "DELETE", f"/v1/files/{body['id']}")

    def status(self, job_id: str) -> dict[str, Any] | None:
        """The job as the registry reports it now (None: no answer)."""
        with contextlib.suppress(httpx.HTTPError, ValueError):
            reply = httpx.get(
                f"{self.tenants.registry}/v1/fine_tuning/jobs/{job_id}",
                headers=self.tenants.headers(self.tenant),
                timeout=10,
            )
            if reply.status_code == 200:
                job: dict[str, Any] = reply.json()
                with self.lock:
                    self.jobs[job_id]["status"] = job["status"]
                return job
        return None

    def spare(self, job_id: str) -> None:
        """Never cancel ``job_id`` (a fault's target whose outcome the soak judges)."""
        with self.lock:
            if "cancel_acknowledged" not in self.jobs[job_id]:
                self.jobs[job_id]["cancel_at"] = None

    def active(self) -> list[str]:
        with self.lock:
            return [j for j, rec in self.jobs.items() if rec["status"] not in TERMINAL]

    def step(self) -> None:
        """One move: refresh the unfinished jobs, cancel those due, keep two in flight,
        upload a file and delete it."""
        for job_id in self.active():
            rec, job = self._call("ft_get", "GET", f"/v1/fine_tuning/jobs/{job_id}")
            if ok(rec["status"]) and isinstance(job, dict):
                with self.lock:
                    self.jobs[job_id]["status"] = job["status"]
        now = self.journal.now()
        for job_id in self.active():
            due = self.jobs[job_id]["cancel_at"]
            if due is not None and due <= now and "cancel_acknowledged" not in self.jobs[job_id]:
                self.cancel(job_id)
        if len(self.active()) < 2:
            self.create()
        self.file_round_trip()

    def loop(self, interval: float, stop: threading.Event) -> None:
        while not stop.wait(self.rng.uniform(0.5, 1.5) * interval):
            self.step()

    def settle(self, timeout: float) -> None:
        """Wait until every acknowledged job has ended (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while (left := self.active()) and time.monotonic() < deadline:
            for job_id in left:
                self.status(job_id)
            time.sleep(1)
        say(f"  fine-tuning: {len(self.jobs)} jobs acknowledged, {len(self.active())} not finished")


def verify_jobs(ft: FineTuning, gateway: str, store: Any) -> dict[str, Any]:
    """Every acknowledged job ended; a cancel acknowledged before the job ended left it
    cancelled; every succeeded job's adapter is listed with a version and served (a user
    bound to it gets an answer from exactly that content); no trainer output stays."""
    from preft_serve.registry.finetune.spec import output_prefix

    out: dict[str, Any] = {
        "acknowledged": len(ft.jobs),
        "by_status": {},
        "errors": {},
        "not_terminal": [],
        "cancel_ignored": [],
        "not_listed": [],
        "not_served": [],
        "output_left": [],
    }
    http = httpx.Client(timeout=60, headers=ft.tenants.headers(ft.tenant))
    for job_id, known in sorted(ft.jobs.items()):
        job = ft.status(job_id) or {"status": "unknown"}
        status = job["status"]
        out["by_status"][status] = out["by_status"].get(status, 0) + 1
        if status not in TERMINAL:
            out["not_terminal"].append([job_id, status])
            continue
        if status == "failed":
            code = (job.get("error") or {}).get("code", "?")
            out["errors"][code] = out["errors"].get(code, 0) + 1
        if "cancel_acknowledged" in known and status != "cancelled":
            out["cancel_ignored"].append([job_id, status])
        if any(True for _ in store.list_keys(output_prefix(job_id))):
            out["output_left"].append(job_id)
        if status != "succeeded":
            continue
        name = job["fine_tuned_model"]
        listed = http.get(f"{ft.tenants.registry}/v1/adapters/{name}")
        shas = (
            {v["sha256"] for v in listed.json()["versions"]} if listed.status_code == 200 else set()
        )
        if not shas:
            out["not_listed"].append([job_id, name, listed.status_code])
            continue
        user = f"u-{name}"
        bound = http.put(f"{ft.tenants.registry}/v1/users/{user}", json={"adapter": name})
        reply = httpx.post(
            f"{gateway}/v1/chat/completions",
            timeout=120,
            headers=ft.tenants.headers(ft.tenant),
            json={
                "user": user,
                "max_tokens": 4,
                "temperature": 0,
                "messages": [{"role": "user", "content": next(iter(FACTS))}],
            },
        )
        if (
            not ok(bound.status_code)
            or reply.status_code != 200
            or reply.headers.get("x-preft-adapter") != name
            or reply.headers.get("x-preft-adapter-sha256") not in shas
        ):
            out["not_served"].append(
                [
                    job_id,
                    name,
                    bound.status_code,
                    reply.status_code,
                    reply.headers.get("x-preft-adapter"),
                ]
            )
    http.close()
    out["served"] = (
        out["by_status"].get("succeeded", 0) - len(out["not_listed"]) - len(out["not_served"])
    )
    return out
