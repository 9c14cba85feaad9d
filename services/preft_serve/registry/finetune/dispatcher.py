"""The loop that runs fine-tuning jobs: a daemon thread in each registry process.

Every ``poll_s`` it refreshes this registry's heartbeat, follows the running jobs it owns
(progress lines -> events, outcome -> registered adapter or failure), fails or adopts
running jobs whose registry is dead (no heartbeat for ``heartbeat_s``: a restart, a
crash), and starts queued jobs while the backend has room and their tenant is under its
running limit. Starting claims the job in a transaction first, so two registries never
start one job twice. State transitions all go through :class:`JobStore.update`, so a job
cancelled meanwhile is never overwritten.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter

from preft_serve.common.audit_wire import AuditAction
from preft_serve.common.domain_errors import DomainError
from preft_serve.common.finetune_wire import JobError, JobStatus
from preft_serve.registry.adapters import AdapterService
from preft_serve.registry.audit import AuditLog
from preft_serve.registry.finetune.files import FileService
from preft_serve.registry.finetune.jobs import JobRecord, JobStore
from preft_serve.registry.finetune.register import register_output
from preft_serve.registry.finetune.runners import Observation, Runner, RunState
from preft_serve.registry.finetune.settings import FinetuneSettings
from preft_serve.registry.finetune.spec import OUTPUT_FILES, TrainerSpec, output_prefix
from preft_serve.registry.metrics import RegistryMetrics
from preft_serve.registry.policy_schemas import VersionState

logger = logging.getLogger(__name__)

INDEX_REPAIR_S = 60.0  # how often a tick adds active jobs missing from their tenant's index


def new_instance() -> str:
    return uuid.uuid4().hex


class Dispatcher:
    def __init__(
        self,
        store: JobStore,
        files: FileService,
        adapters: AdapterService,
        runner: Runner,
        settings: FinetuneSettings,
        model_path: str,
        instance: str,
        metrics: RegistryMetrics,
        audit: AuditLog,
    ) -> None:
        self.metrics, self.audit = metrics, audit
        self.store, self.files, self.adapters, self.runner = store, files, adapters, runner
        self.settings, self.model_path, self.instance = settings, model_path, instance
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._owned: set[str] = set()
        self._polled: dict[str, float] = {}
        self._next_index_repair = 0.0  # time.monotonic() of the next repair

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> Dispatcher:
        """Start the loop (Redis may be down now: the loop retries, the app still starts)."""
        self._thread = threading.Thread(target=self._run, name="finetune-dispatcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop; local trainers die with their registry (their jobs fail, with
        that reason), Kubernetes Jobs run on for the next registry to adopt."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self.runner.stops_with_registry:
            for job_id in list(self._owned):
                try:
                    record = self.store.get(job_id)
                except Exception:  # noqa: BLE001
                    record = None
                if record is not None:
                    self.runner.cancel(job_id, record.runner)
                    self._fail(job_id, "the registry stopped while the job ran", "runner_stopped")
        self.runner.close()
        try:
            self.store.retire(self.instance)
        except Exception:  # noqa: BLE001  (Redis down at shutdown: the key expires anyway)
            logger.warning("could not retire runner heartbeat %s", self.instance)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                logger.exception("fine-tuning dispatcher iteration failed; retrying")
            self._stop.wait(self.settings.poll_s)

    # -- one iteration --------------------------------------------------------------------

    def tick(self) -> None:
        self.store.beat(self.instance, self.settings.heartbeat_s)
        active = self.store.active()
        active_ids = {r.id for r in active}
        if time.monotonic() >= self._next_index_repair:
            # Jobs a registry of an older version created during a rolling update are in
            # the global index only; the per-tenant limits read the tenant's.
            self.store.index_active(active)
            self._next_index_repair = time.monotonic() + INDEX_REPAIR_S
        for state in (JobStatus.QUEUED, JobStatus.RUNNING):
            self.metrics.finetune_jobs.labels(state.value).set(
                sum(1 for r in active if r.status is state)
            )
        for job_id in list(self._owned - active_ids):  # cancelled (or finished elsewhere)
            record = self.store.get(job_id)
            self._owned.discard(job_id)
            self._polled.pop(job_id, None)
            # None: deleted already (its tenant's retention); the runner finds a trainer
            # it started by the job's id alone.
            self.runner.cancel(job_id, record.runner if record is not None else {})
            self._discard_output(job_id)
        for record in active:
            if record.status is not JobStatus.RUNNING:
                continue
            owner = str(record.runner.get("instance", ""))
            if owner == self.instance:
                self._follow(record)
            elif not self.store.alive(owner):
                self._orphaned(record)
        self._start_queued(
            [r for r in active if r.status is not JobStatus.RUNNING],
            Counter(r.tenant for r in active if r.status is JobStatus.RUNNING),
        )

    def _start_queued(self, queued: list[JobRecord], running: Counter[str]) -> None:
        room = self.runner.capacity()
        for record in queued:
            if room <= 0:
                return
            if running[record.tenant] >= self.settings.tenant_max_running:
                continue
            if self._claim(record.id) is None:
                continue
            room -= 1
            running[record.tenant] += 1
            self._launch(record)

    def _claim(self, job_id: str) -> JobRecord | None:
        def change(r: JobRecord) -> JobRecord | None:
            if r.status is not JobStatus.QUEUED:
                return None
            r.job.status = JobStatus.RUNNING
            r.started_at = time.time()
            r.runner = {"backend": self.runner.name, "instance": self.instance}
            return r

        claimed = self.store.update(job_id, change, "Fine-tuning job started")
        if claimed is not None:
            self._owned.add(job_id)
        return claimed

    def _launch(self, record: JobRecord) -> None:
        args = record.train_args
        spec = TrainerSpec(
            job_id=record.id,
            model=self.model_path,
            training_key=args["training_key"],
            validation_key=args.get("validation_key"),
            options={k: v for k, v in args.items() if k not in ("training_key", "validation_key")},
        )
        try:
            info = self.runner.start(spec, record.tenant)
        except Exception as exc:
            logger.exception("job %s: the trainer did not start", record.id)
            self._fail(record.id, f"the trainer could not be started: {exc}"[:500], "runner_error")
            return
        info["instance"] = self.instance

        def change(r: JobRecord) -> JobRecord | None:
            if r.status is not JobStatus.RUNNING:
                return None
            r.runner = info
            return r

        if self.store.update(record.id, change) is None:  # cancelled while starting
            self.runner.cancel(record.id, info)

    def _follow(self, record: JobRecord) -> None:
        now = time.monotonic()
        if now - self._polled.get(record.id, 0.0) < self.runner.poll_every_s:
            return
        self._polled[record.id] = now
        try:
            seen = self.runner.poll(record.id, record.runner)
        except Exception as exc:  # noqa: BLE001  (a backend hiccup: retried next poll)
            logger.warning("job %s: cannot read the trainer's state (%s)", record.id, exc)
            return
        self._record_lines(record.id, seen)
        if seen.runner is not None and seen.runner != record.runner:

            def keep(r: JobRecord) -> JobRecord | None:
                if r.status is not JobStatus.RUNNING:
                    return None
                r.runner = {**seen.runner, "instance": self.instance}  # type: ignore[dict-item]
                return r

            self.store.update(record.id, keep)
        if seen.state is RunState.RUNNING:
            limit = self.settings.job_timeout_s
            if record.started_at and time.time() - record.started_at > limit:
                self.runner.cancel(record.id, record.runner)
                self._fail(record.id, f"the job ran longer than {limit} s", "timeout")
            return
        self._owned.discard(record.id)
        self._polled.pop(record.id, None)
        if seen.state is RunState.FAILED:
            self._fail(record.id, seen.reason or "the trainer failed", "training_failed")
            return
        self._succeed(record)

    def _record_lines(self, job_id: str, seen: Observation) -> None:
        for line in seen.lines:
            kind = str(line.get("preft_event"))
            data = line.get("data") if isinstance(line.get("data"), dict) else None
            message = str(line.get("message", ""))
            if kind == "metrics":
                self.store.add_event(job_id, message, "info", "metrics", data)
                self._progress(job_id, data)
            elif kind == "error":
                self.store.add_event(job_id, message, "error")
            elif kind in ("message", "result"):
                self.store.add_event(job_id, message, "info", "message", data)

    def _progress(self, job_id: str, data: dict[str, object] | None) -> None:
        step, total = (data or {}).get("step"), (data or {}).get("total_steps")
        if isinstance(step, int) and isinstance(total, int):
            self.store.progress(job_id, step, total)

    def _succeed(self, record: JobRecord) -> None:
        current = self.store.get(record.id)
        if current is None or current.status is not JobStatus.RUNNING:
            self._discard_output(record.id)
            return  # cancelled meanwhile: nothing is registered
        try:
            done = register_output(current, self.adapters, self.files, promote=current.promote)
        except DomainError as exc:
            self._fail(
                record.id,
                f"the trained adapter was refused: {exc.message}"[:2000],
                "invalid_adapter",
            )
            return
        except Exception as exc:
            logger.exception("job %s: registering the adapter failed", record.id)
            self._fail(
                record.id, f"registering the adapter failed: {exc}"[:500], "registration_failed"
            )
            return

        if done.audit_change is not None:
            before, after = done.audit_change
            actor = current.actor or f"fine_tuning:{record.id}"
            self.audit.record(
                current.tenant, actor, AuditAction.ADAPTER_VERSION, done.name,
                before=before, after=after,
            )  # fmt: skip

        def change(r: JobRecord) -> JobRecord | None:
            if r.status is not JobStatus.RUNNING:
                return None
            r.job.status, r.job.finished_at = JobStatus.SUCCEEDED, int(time.time())
            r.job.estimated_finish = None
            r.job.fine_tuned_model = done.name
            r.job.trained_tokens = done.trained_tokens
            r.job.result_files = [done.result_file] if done.result_file else []
            r.checkpoints = [done.checkpoint]
            return r

        self.store.add_event(
            record.id,
            f"New fine-tuned model created: {done.name} "
            f"(version {done.version}, sha256 {done.sha256[:12]})"
            + (
                f"; staged: '{done.name}' serves its current version until POST "
                f"/v1/adapters/{done.name}/versions/{done.version}/promote, and "
                f"'{done.name}@{done.version}' runs this one"
                if done.state is VersionState.STAGED
                else ""
            ),
        )
        if done.result_file is None:
            self.store.add_event(
                record.id,
                "The result file was not stored: this tenant "
                f"keeps at most {self.settings.tenant_max_files} files; "
                "delete some to keep the next ones",
                "warn",
            )
        if self.store.update(record.id, change, "The job has successfully completed"):
            self.metrics.finetune_finished.labels("succeeded").inc()
            self.metrics.finetune_tokens.inc(done.trained_tokens)
        logger.info("job %s succeeded: adapter %s version %d", record.id, done.name, done.version)

    def _orphaned(self, record: JobRecord) -> None:
        backend = record.runner.get("backend")
        reason = (
            f"the job ran on the {backend} backend; this registry uses {self.runner.name}"
            if backend != self.runner.name
            else self.runner.orphan(record.id, record.runner)
        )
        if reason is None:
            self._adopt(record, "Followed by a new registry instance")
        elif self._output_complete(record.id) and self._adopt(
            record, "The trainer had finished before its registry stopped; registering its adapter"
        ):
            # Killed between the trainer's exit and the job's success (mid-registration):
            # the output is whole, and registering is idempotent (same content, same version).
            self._owned.discard(record.id)
            self._succeed(record)
        else:
            self._fail(record.id, reason, "runner_lost")

    def _adopt(self, record: JobRecord, message: str) -> bool:
        """Claim a dead registry's running job (one transaction: one registry wins)."""

        def adopt(r: JobRecord) -> JobRecord | None:
            if r.status is not JobStatus.RUNNING or r.runner != record.runner:
                return None
            r.runner = {**r.runner, "instance": self.instance}
            return r

        if self.store.update(record.id, adopt, message) is None:
            return False
        self._owned.add(record.id)
        return True

    def _output_complete(self, job_id: str) -> bool:
        """Whether the trainer stored all of its output (it stores the metrics file last
        and exits 0 right after)."""
        prefix = output_prefix(job_id)
        try:
            return all(self.adapters.store.exists(prefix + name) for name in OUTPUT_FILES)
        except Exception as exc:  # noqa: BLE001 (the store's outage: the job fails as lost)
            logger.warning("job %s: cannot read its trainer's output (%s)", job_id, exc)
            return False

    def _fail(self, job_id: str, reason: str, code: str) -> None:
        def change(r: JobRecord) -> JobRecord | None:
            if r.status.finished:
                return None
            r.job.status, r.job.finished_at = JobStatus.FAILED, int(time.time())
            r.job.estimated_finish = None
            r.job.error = JobError(code=code, message=reason)
            return r

        self._owned.discard(job_id)
        self._discard_output(job_id)
        if self.store.update(job_id, change, f"Job failed: {reason}", level="error"):
            self.metrics.finetune_finished.labels("failed").inc()
            logger.warning("job %s failed: %s", job_id, reason)

    def cancel_now(self, record: JobRecord) -> None:
        """A cancel arrived through this registry: stop the trainer now if it is ours
        (another registry's loop stops its own within one poll), and discard what the
        trainer stored either way. The job's registry may have been killed after its
        trainer had stored its output (mid-registration): no loop would ever see the cancel
        for it, since a cancelled job is no longer adopted, and the output would stay."""
        if record.runner.get("instance") == self.instance:
            self._owned.discard(record.id)
            self.runner.cancel(record.id, record.runner)
        self._discard_output(record.id)

    def _discard_output(self, job_id: str) -> None:
        """What a trainer of a job that did not succeed stored: in no tenant's quota, so it
        must not stay (a tenant could otherwise fill the store with failing jobs)."""
        store = self.adapters.store
        try:
            for key in list(store.list_keys(output_prefix(job_id))):
                store.delete(key)
        except Exception as exc:  # noqa: BLE001 (the store's outage is not the job's)
            logger.warning("job %s: its trainer output stays in the store: %s", job_id, exc)
