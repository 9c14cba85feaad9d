"""Fine-tuning job records and their events in Redis (they survive registry restarts).

A job is one JSON record under ``RegistryKeys.job``; every change is an optimistic
transaction (WATCH) so the dispatcher, a cancel and a restarted registry never overwrite
each other's transitions, and a finished job never changes state again. Events are a
capped stream per job. ``active_jobs`` indexes the queued and running ones, which is all
the dispatcher reads; ``tenant_active_jobs`` indexes each tenant's, which is all a create
reads for the tenant's limits (a handful of records, whatever the other tenants run).

A tenant keeps a bounded number of finished jobs: creating a job deletes the tenant's
finished ones that ended first, past the limit (:meth:`JobStore.create_limited`), so a
long job that ends late is kept as long as any other that ends then. A deleted job's
late writes (a runner still reporting on it) create nothing: :meth:`JobStore.update`
needs the record, and :meth:`JobStore.add_event` appends only while the record exists.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from preft_serve.common.finetune_wire import Checkpoint, FineTuningJob, JobEvent, JobStatus
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry.finetune.ids import event_id, stream_id
from preft_serve.registry.txn import transact

MAX_MESSAGE = 1000
PRUNE_PER_CREATE = 10  # finished jobs one create deletes at most (each create adds one)
MATCH_SCAN = 1000  # job records a filtered listing reads per call once it has a match
MATCH_BATCH = 100
FINISHED_BATCH = 500  # job records read at once while a tenant's finished index is filled
RECHECK_S = 600  # least time between two fills of one tenant's finished index
CURSOR_MARKS = 1000  # deleted jobs whose place in the listing a tenant's cursors may name

# KEYS: the job's record, its events. ARGV: the stream's cap, then field/value pairs. A job
# deleted meanwhile (retention, its tenant's deletion) gets no stream without a record.
_EVENT_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
return redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', unpack(ARGV, 2))
"""


# KEYS: the global active index, a tenant's. ARGV: a job id. Adds the job to the tenant's
# index with its global score while it is still active there: a job that ended (left both
# in one transaction) is never added back.
_ADD_IF_ACTIVE = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return 0 end
return redis.call('ZADD', KEYS[2], score, ARGV[1])
"""


def estimate_finish(started_at: float, now: float, step: int, total: int) -> int | None:
    """When a job at ``step`` of ``total`` ends at its pace so far (the start counts:
    loading the model is part of any job's time); None before the first step."""
    if step <= 0 or total <= 0:
        return None
    return int(started_at + (now - started_at) * max(total, step) / step)


class JobRecord(BaseModel):
    """The public job plus what the registry needs to run and follow it."""

    job: FineTuningJob
    tenant: str
    adapter_name: str
    training_sha256: str
    validation_sha256: str | None = None
    train_args: dict[str, Any] = Field(default_factory=dict)  # the TrainerSpec's options
    promote: bool = True  # serve the trained version at once (False: store it staged)
    actor: str | None = None  # the key id that created the job (its audit entries' actor)
    runner: dict[str, Any] = Field(default_factory=dict)  # backend, instance, pid, ...
    started_at: float | None = None
    checkpoints: list[Checkpoint] = Field(default_factory=list)

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def status(self) -> JobStatus:
        return self.job.status


class JobStore:
    def __init__(self, client: Any, keys: RegistryKeys, events_maxlen: int) -> None:
        self.redis, self.keys, self.maxlen = client, keys, events_maxlen
        self._by_tenant_seen = False  # the marker that older active jobs were added was read

    def create(self, record: JobRecord, message: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        self._queue_create(pipe, record, message)
        pipe.execute()

    def _queue_create(self, pipe: Any, record: JobRecord, message: str) -> None:
        # Newest first needs the write's own instant: the record's whole-second created_at
        # plus the clock's millisecond at write time could step back across a second
        # boundary and list a job after an older one (µs, as the file index scores).
        score = time.time_ns() // 1000
        pipe.set(self.keys.job(record.id), record.model_dump_json())
        pipe.zadd(self.keys.tenant_jobs(record.tenant), {record.id: score})
        pipe.zadd(self.keys.active_jobs, {record.id: score})
        pipe.zadd(self.keys.tenant_active_jobs(record.tenant), {record.id: score})
        self._queue_event(pipe, record.id, message, "info", "message", None)

    def create_limited(
        self, record: JobRecord, limit: int, message: str, keep_finished: int | None = None
    ) -> bool:
        """Create the job unless its tenant already has ``limit`` active ones (checked and
        written in one transaction over the tenant's active index, so concurrent creates
        cannot both take the last place; other tenants' creates and transitions do not
        touch it, so they neither slow nor retry this one).

        ``keep_finished``: the finished jobs (succeeded, failed, cancelled) the tenant
        keeps. The same transaction deletes the tenant's finished jobs that ended first
        past it (``tenant_finished_jobs``), at most :data:`PRUNE_PER_CREATE` (bounded work
        per request), each whole: record, event stream and index entries. Creating is the
        one place a tenant's job count grows, so pruning there bounds it without touching
        the dispatcher's transitions:
        between two creates the tenant holds at most ``keep_finished`` finished jobs plus
        the ones that were active at the first (and an excess left by lowering the setting
        shrinks by ``PRUNE_PER_CREATE - 1`` per create). Queued and running jobs are never
        deleted: a job outside the (watched) active index is finished, and a finished job
        never changes state again, so the candidates cannot change under the transaction.
        """

        self._index_active_by_tenant()
        if keep_finished is not None:
            self._index_finished(record.tenant)
        index = self.keys.tenant_active_jobs(record.tenant)

        def txn(pipe: Any) -> bool:
            ids = pipe.zrange(index, 0, -1)
            raws = pipe.mget([self.keys.job(i) for i in ids]) if ids else []
            records = [JobRecord.model_validate_json(raw) if raw else None for raw in raws]
            live = {
                i
                for i, r in zip(ids, records, strict=True)
                if r is not None and r.tenant == record.tenant and not r.status.finished
            }
            stale = [i for i in ids if i not in live]  # ended while the index was filled
            mine = len(live)
            if mine >= limit:
                pipe.multi()
                if stale:
                    pipe.zrem(index, *stale)
                return False
            doomed = (
                {}
                if keep_finished is None
                else self._past_retention(pipe, record.tenant, live, keep_finished)
            )
            pipe.multi()
            if stale:
                pipe.zrem(index, *stale)
            self._queue_create(pipe, record, message)
            for job_id in doomed:
                pipe.delete(self.keys.job(job_id), self.keys.job_events(job_id))
                pipe.zrem(self.keys.tenant_jobs(record.tenant), job_id)
                pipe.zrem(self.keys.tenant_finished_jobs(record.tenant), job_id)
            self._queue_cursor_marks(pipe, record.tenant, doomed)
            return True

        return transact(self.redis, txn, index)

    def _index_active_by_tenant(self) -> None:
        """Once per namespace: add the active jobs of a registry from before the
        per-tenant index to it (:meth:`index_active`; the dispatcher repeats that now and
        then for jobs an older registry creates during a rolling update)."""
        if self._by_tenant_seen or self.redis.exists(self.keys.active_jobs_by_tenant):
            self._by_tenant_seen = True
            return
        self.index_active(self.active())
        self.redis.set(self.keys.active_jobs_by_tenant, "1")
        self._by_tenant_seen = True

    def index_active(self, records: list[JobRecord]) -> None:
        """Add each of ``records`` (active jobs) to its tenant's active index, unless it
        has ended meanwhile (checked in Redis, so an ended job is never added back)."""
        pipe = self.redis.pipeline(transaction=False)
        for record in records:
            keys = (self.keys.active_jobs, self.keys.tenant_active_jobs(record.tenant))
            pipe.eval(_ADD_IF_ACTIVE, 2, *keys, record.id)
        pipe.execute()

    def _past_retention(
        self, pipe: Any, tenant: str, active: set[str], keep: int
    ) -> dict[str, float]:
        """The tenant's finished jobs that ended first, past ``keep``, at most
        PRUNE_PER_CREATE (never one of ``active``, its active jobs; reads that many ids
        and records), with their places in the listing."""
        finished = self.keys.tenant_finished_jobs(tenant)
        over = min(pipe.zcard(finished) - keep, PRUNE_PER_CREATE)
        if over <= 0:
            return {}
        ended = [i for i in pipe.zrange(finished, 0, over - 1) if i not in active]
        if not ended:
            return {}
        raws = pipe.mget([self.keys.job(i) for i in ended])
        listed = self.keys.tenant_jobs(tenant)
        doomed: dict[str, float] = {}  # id -> its place in the listing
        for job_id, raw in zip(ended, raws, strict=True):
            found = JobRecord.model_validate_json(raw) if raw else None
            if found is None or (found.tenant == tenant and found.status.finished):
                # a record already gone: its index entries go
                doomed[job_id] = pipe.zscore(listed, job_id) or 0.0
        return doomed

    def _queue_cursor_marks(self, pipe: Any, tenant: str, doomed: dict[str, float]) -> None:
        """Keep where the deleted jobs stood in the listing (the last ``CURSOR_MARKS``), so
        a client paging with one of them as its cursor reads on from there."""
        if not doomed:
            return
        marks = self.keys.tenant_pruned_jobs(tenant)
        pipe.zadd(marks, {i: score for i, score in doomed.items() if score})
        pipe.zremrangebyrank(marks, 0, -CURSOR_MARKS - 1)

    def _index_finished(self, tenant: str) -> None:
        """Add the tenant's finished jobs the finished index lacks: once, for jobs that
        ended before it existed, and again (at most every ``RECHECK_S``) when the tenant
        holds more jobs than its active and finished indexes together (jobs a registry of
        an older version finished during a rolling update). By ``finished_at`` (seconds,
        so they sort before every job that ends after), a batch of records at a time; a
        tenant keeps at most its retention plus its active jobs."""
        done = self.keys.tenant_finished_indexed(tenant)
        finished = self.keys.tenant_finished_jobs(tenant)
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(done)
        pipe.zcard(self.keys.tenant_jobs(tenant))
        pipe.zcard(self.keys.tenant_active_jobs(tenant))
        pipe.zcard(finished)
        last, kept, active, indexed = pipe.execute()
        now = time.time()
        if last is not None and (kept <= active + indexed or now - float(last) < RECHECK_S):
            return
        ids = self.redis.zrange(self.keys.tenant_jobs(tenant), 0, -1)
        for start in range(0, len(ids), FINISHED_BATCH):
            batch = ids[start : start + FINISHED_BATCH]
            ended = {
                r.id: (r.job.finished_at or r.job.created_at) * 1_000_000
                for r in (
                    JobRecord.model_validate_json(raw)
                    for raw in self.redis.mget([self.keys.job(i) for i in batch])
                    if raw
                )
                if r.status.finished
            }
            if ended:
                # NX: a job the index holds keeps the finer time it ended at
                self.redis.zadd(finished, ended, nx=True)
        self.redis.set(done, str(now))  # when it ran

    def get(self, job_id: str) -> JobRecord | None:
        raw = self.redis.get(self.keys.job(job_id))
        return JobRecord.model_validate_json(raw) if raw else None

    def update(
        self,
        job_id: str,
        change: Callable[[JobRecord], JobRecord | None],
        message: str | None = None,
        level: str = "info",
    ) -> JobRecord | None:
        """Apply ``change`` to the stored record atomically; ``None`` from it: no change.

        Returns the new record, or None when unchanged. A finished job leaves the active
        index in the same transaction, and ``message`` becomes an event with it.
        """
        key = self.keys.job(job_id)

        def txn(pipe: Any) -> JobRecord | None:
            raw = pipe.get(key)
            if raw is None:
                return None
            new = change(JobRecord.model_validate_json(raw))
            pipe.multi()
            if new is None:
                return None
            pipe.set(key, new.model_dump_json())
            if new.status.finished:
                pipe.zrem(self.keys.active_jobs, job_id)
                pipe.zrem(self.keys.tenant_active_jobs(new.tenant), job_id)
                ended_us = time.time_ns() // 1000  # finer than finished_at (seconds)
                finished = self.keys.tenant_finished_jobs(new.tenant)
                pipe.zadd(finished, {job_id: ended_us}, nx=True)
            if message:
                self._queue_event(pipe, job_id, message, level, "message", None)
            return new

        return transact(self.redis, txn, key)

    def add_event(
        self,
        job_id: str,
        message: str,
        level: str = "info",
        kind: str = "message",
        data: dict[str, Any] | None = None,
    ) -> None:
        """Append an event, outside any transaction (a runner's progress): only while
        the job's record exists, so a job deleted meanwhile stays deleted whole."""
        fields = self._event_fields(message, level, kind, data)
        args: list[str | int] = [self.maxlen]
        for name, value in fields.items():
            args += [name, value]
        self.redis.eval(_EVENT_LUA, 2, self.keys.job(job_id), self.keys.job_events(job_id), *args)

    def _queue_event(
        self,
        pipe: Any,
        job_id: str,
        message: str,
        level: str,
        kind: str,
        data: dict[str, Any] | None,
    ) -> None:
        """In a transaction that writes (or watched) the job's record."""
        fields = self._event_fields(message, level, kind, data)
        pipe.xadd(self.keys.job_events(job_id), fields, maxlen=self.maxlen, approximate=True)

    @staticmethod
    def _event_fields(
        message: str, level: str, kind: str, data: dict[str, Any] | None
    ) -> dict[str, str]:
        fields = {
            "message": message[:MAX_MESSAGE],
            "level": level,
            "type": kind,
            "ts": str(int(time.time())),
        }
        if data is not None:
            fields["data"] = json.dumps(data)
        return fields

    def events(self, job_id: str, after: str | None, limit: int) -> tuple[list[JobEvent], bool]:
        """Newest first (OpenAI's order); ``after``: an event id, older ones follow it."""
        top = "+"
        if after:
            sid = stream_id(after)
            if tuple(map(int, sid.split("-"))) == (0, 0):
                return [], False  # nothing is older than the first possible id
            top = f"({sid}"
        rows = self.redis.xrevrange(self.keys.job_events(job_id), top, "-", count=limit + 1)
        out = []
        for sid, fields in rows[:limit]:
            data = json.loads(fields["data"]) if "data" in fields else None
            out.append(
                JobEvent(
                    id=event_id(sid),
                    created_at=int(fields.get("ts", "0")),
                    level=fields.get("level", "info"),
                    message=fields.get("message", ""),
                    data=data,
                    type=fields.get("type", "message"),
                )
            )
        return out, len(rows) > limit

    def page(
        self,
        tenant: str,
        after: str | None,
        limit: int,
        match: Callable[[JobRecord], bool] | None = None,
    ) -> tuple[list[JobRecord], bool]:
        """Newest first; ``after``: a job id, older ones follow it. ``match``: only the jobs
        it accepts (read in batches, newest first, until the page is full).

        A filtered page reads at most about ``MATCH_SCAN`` records once it holds a match:
        then it ends early with ``has_more`` true, and the client's next call (``after``
        the last job returned) reads on from there. Until a first match it reads on to
        the end of the history: an empty page cannot carry the cursor (``after`` is the
        last id returned; the SDK stops at an empty page), so stopping there would hide
        the older matches. The history it may read is what the tenant keeps: at most
        ``tenant_max_jobs_kept`` finished jobs plus its queued and running ones.
        """
        key = self.keys.tenant_jobs(tenant)
        top: str | float = "+inf"
        if after is not None:
            score = self.redis.zscore(key, after)
            if score is None:  # deleted by retention since the client read it
                score = self.redis.zscore(self.keys.tenant_pruned_jobs(tenant), after)
            if score is None:
                return [], False
            top = f"({score}"
        want = limit + 1
        batch = want if match is None else max(want, MATCH_BATCH)
        found: list[JobRecord] = []
        read = 0
        while True:
            rows = self.redis.zrevrangebyscore(
                key, top, "-inf", start=0, num=batch, withscores=True
            )
            raws = self.redis.mget([self.keys.job(i) for i, _ in rows]) if rows else []
            read += len(rows)
            for raw in raws:
                record = JobRecord.model_validate_json(raw) if raw else None
                if record is not None and (match is None or match(record)):
                    found.append(record)
                    if len(found) == want:
                        return found[:limit], True
            if len(rows) < batch:
                return found, False
            if found and read >= MATCH_SCAN:
                return found, True  # the next call goes on after found[-1]
            top = f"({rows[-1][1]}"

    def active(self) -> list[JobRecord]:
        """Queued and running jobs, oldest first."""
        ids = self.redis.zrange(self.keys.active_jobs, 0, -1)
        return [r for r in (self.get(i) for i in ids) if r is not None]

    def progress(self, job_id: str, step: int, total: int) -> JobRecord | None:
        """A running job reached ``step`` of ``total``: its ``estimated_finish`` follows."""
        now = time.time()

        def change(r: JobRecord) -> JobRecord | None:
            if r.status is not JobStatus.RUNNING or r.started_at is None:
                return None
            r.job.estimated_finish = estimate_finish(r.started_at, now, step, total)
            return r

        return self.update(job_id, change)

    # -- runner liveness ------------------------------------------------------------------

    def using_file(self, tenant: str, file_id: str) -> list[str]:
        """Ids of the tenant's queued or running jobs that read ``file_id`` (read from its
        own active index: a file delete's work does not grow with other tenants' jobs)."""
        self._index_active_by_tenant()
        ids = self.redis.zrange(self.keys.tenant_active_jobs(tenant), 0, -1)
        raws = self.redis.mget([self.keys.job(i) for i in ids]) if ids else []
        records = [JobRecord.model_validate_json(raw) for raw in raws if raw]
        return [
            r.id
            for r in records
            if r.tenant == tenant
            and not r.status.finished
            and file_id in (r.job.training_file, r.job.validation_file)
        ]

    def beat(self, instance: str, ttl_s: float) -> None:
        self.redis.set(self.keys.runner_heartbeat(instance), "1", px=int(ttl_s * 1000))

    def alive(self, instance: str) -> bool:
        try:
            return bool(self.redis.exists(self.keys.runner_heartbeat(instance)))
        except ValueError:  # not an instance id at all
            return False

    def retire(self, instance: str) -> None:
        self.redis.delete(self.keys.runner_heartbeat(instance))
