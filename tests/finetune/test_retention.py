"""A tenant keeps a bounded number of finished jobs: creating one deletes its finished
jobs that ended first past ``tenant_max_jobs_kept`` whole (record, events, index entries), never a
queued or running one nor another tenant's; a runner's late writes to a deleted job
create nothing; a listing filtered by metadata reads a bounded number of records."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from preft_serve.common.finetune_wire import FineTuningJob, JobStatus
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry.finetune import jobs as jobs_module
from preft_serve.registry.finetune.dispatcher import Dispatcher
from preft_serve.registry.finetune.jobs import (
    PRUNE_PER_CREATE,
    RECHECK_S,
    JobRecord,
    JobStore,
)
from preft_serve.registry.finetune.settings import FinetuneSettings
from preft_serve.registry.metrics import RegistryMetrics
from tests.finetune.conftest import Api, chat_jsonl

JOBS = "/v1/fine_tuning/jobs"
FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


def job_keys(client: redis.Redis, namespace: str) -> set[str]:
    """Every key of the namespace that names a job (records, event streams)."""
    return {k for k in client.scan_iter(match=f"{namespace}:*", count=1000) if "ftjob-" in k}


def whole(keys: RegistryKeys, ids: list[str]) -> set[str]:
    return {k for i in ids for k in (keys.job(i), keys.job_events(i))}


def new_record(tenant: str = "acme", metadata: dict[str, str] | None = None) -> JobRecord:
    job = FineTuningJob(
        id=f"ftjob-{uuid.uuid4().hex[:24]}",
        created_at=int(time.time()),
        model="m",
        organization_id=tenant,
        status=JobStatus.QUEUED,
        training_file="file-x",
        hyperparameters={},
        seed=0,
        method={},
        metadata=metadata,
    )
    return JobRecord(job=job, tenant=tenant, adapter_name="a", training_sha256="0" * 64)


def set_status(store: JobStore, job_id: str, status: JobStatus) -> None:
    def change(r: JobRecord) -> JobRecord:
        r.job.status = status
        if status is JobStatus.RUNNING:
            r.started_at, r.runner = time.time(), {"backend": "local", "instance": "x" * 32}
        return r

    assert store.update(job_id, change, f"now {status.value}") is not None


def finish_another(store: JobStore) -> None:
    """A newer finished job, so that with one kept the older finished one goes."""
    record = new_record()
    store.create(record, "queued")
    set_status(store, record.id, JobStatus.FAILED)


# -- through the API ----------------------------------------------------------------------


def test_finished_jobs_past_the_limit_go_whole_and_nothing_else_does(
    serve: Callable[..., Api], redis_server: str, namespace: str, client: redis.Redis
) -> None:
    # The dispatcher polls once a minute: queued jobs stay queued during the test.
    api = serve(poll_s=60, tenant_max_queued=20, max_steps=60, tenant_max_jobs_kept=3)
    keys = RegistryKeys(namespace)
    store = JobStore(client, keys, 100)
    body = {"model": "tiny-llama", "method": {"type": "preft", "preft": {"steps": 2}}}

    def create(key: str, file_id: str) -> str:
        reply = api.call(key, "POST", JOBS, json={**body, "training_file": file_id})
        assert reply.status_code == 200, reply.text
        return str(reply.json()["id"])

    def cancel(key: str, job_id: str) -> None:
        reply = api.call(key, "POST", f"{JOBS}/{job_id}/cancel")
        assert reply.status_code == 200 and reply.json()["status"] == "cancelled", reply.text

    beta = api.tenant("beta")
    beta_file = api.upload(beta, chat_jsonl()).json()["id"]
    theirs = [create(beta, beta_file) for _ in range(5)]
    for job_id in theirs:
        cancel(beta, job_id)  # finished, older than all of acme's, and over acme's limit

    acme = api.tenant("acme")
    file_id = api.upload(acme, chat_jsonl()).json()["id"]
    queued = create(acme, file_id)  # acme's oldest job, never finished
    running = create(acme, file_id)
    set_status(store, running, JobStatus.RUNNING)  # as a dispatcher's claim leaves it
    cancelled = []
    for _ in range(6):
        cancelled.append(create(acme, file_id))
        cancel(acme, cancelled[-1])
    newest = create(acme, file_id)

    gone, kept = cancelled[:3], [queued, running, *cancelled[3:], newest]
    assert job_keys(client, namespace) == whole(keys, kept + theirs)
    everything = list(client.scan_iter(match=f"{namespace}:*", count=1000))
    assert not [k for k in everything for i in gone if i in k]
    for key in everything:  # no index of any kind still names a deleted job
        if key == keys.tenant_pruned_jobs("acme"):  # but where each stood, for cursors
            assert set(client.zrange(key, 0, -1)) == set(gone)
            continue
        kind = client.type(key)
        members = (
            client.zrange(key, 0, -1)
            if kind == "zset"
            else client.smembers(key)
            if kind == "set"
            else client.hkeys(key)
            if kind == "hash"
            else []
        )
        assert not set(members) & set(gone), key
    assert set(client.zrange(keys.tenant_jobs("acme"), 0, -1)) == set(kept)
    assert set(client.zrange(keys.tenant_jobs("beta"), 0, -1)) == set(theirs)
    assert set(client.zrange(keys.active_jobs, 0, -1)) == {queued, running, newest}

    for job_id in gone:
        assert api.call(acme, "GET", f"{JOBS}/{job_id}").status_code == 404
        assert api.call(acme, "GET", f"{JOBS}/{job_id}/events").status_code == 404
    events = api.call(acme, "GET", f"{JOBS}/{cancelled[3]}/events").json()["data"]
    assert [e["message"] for e in events] == [
        "Job cancelled",
        "Validated training file; job queued",
    ]

    pages, after = [], None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"after": after} if after else {})}
        page = api.call(acme, "GET", JOBS, params=params).json()
        pages.append([j["id"] for j in page["data"]])
        if not page["has_more"]:
            break
        after = pages[-1][-1]
    assert pages == [[newest, cancelled[5]], [cancelled[4], cancelled[3]], [running, queued]]
    listed = api.call(beta, "GET", JOBS, params={"limit": 100}).json()
    assert [j["id"] for j in listed["data"]] == theirs[::-1] and not listed["has_more"]


# -- the store ----------------------------------------------------------------------------


def test_each_create_deletes_a_bounded_number_of_the_oldest_finished_jobs(
    store: JobStore, client: redis.Redis, namespace: str
) -> None:
    keys = store.keys
    queued, running = new_record(), new_record()
    store.create(queued, "queued")
    store.create(running, "queued")
    set_status(store, running.id, JobStatus.RUNNING)
    finished = []
    for n in range(25):
        record = new_record()
        store.create(record, "queued")
        set_status(store, record.id, FINISHED[n % 3])
        finished.append(record.id)
    other = new_record("beta")
    store.create(other, "queued")
    set_status(store, other.id, JobStatus.SUCCEEDED)

    created = []
    for left in (25 - PRUNE_PER_CREATE, 25 - 2 * PRUNE_PER_CREATE, 1, 1):
        created.append(new_record())
        assert store.create_limited(created[-1], 100, "queued", keep_finished=1)
        assert client.zrange(keys.tenant_jobs("acme"), 0, -1) == [
            queued.id,
            running.id,
            *finished[25 - left :],
            *(r.id for r in created),
        ]
    active = [queued.id, running.id, *(r.id for r in created)]
    assert job_keys(client, namespace) == whole(keys, [*active, finished[-1], other.id])
    assert client.zrange(keys.active_jobs, 0, -1) == active
    assert client.zrange(keys.tenant_jobs("beta"), 0, -1) == [other.id]
    # Without a retention (the plain create) nothing goes.
    assert store.create_limited(new_record(), 100, "queued")
    assert len(client.zrange(keys.tenant_jobs("acme"), 0, -1)) == len(active) + 2


def test_a_long_job_that_ends_last_is_kept_over_those_that_ended_before(
    store: JobStore, client: redis.Redis
) -> None:
    keys = store.keys
    long_job = new_record()  # created first, ends last
    store.create(long_job, "queued")
    set_status(store, long_job.id, JobStatus.RUNNING)
    short = []
    for _ in range(3):
        record = new_record()
        store.create(record, "queued")
        set_status(store, record.id, JobStatus.SUCCEEDED)
        short.append(record.id)
    set_status(store, long_job.id, JobStatus.SUCCEEDED)
    fresh = new_record()
    assert store.create_limited(fresh, 100, "queued", keep_finished=2)
    # Four finished, two kept: the two that ended first go, not the oldest created.
    assert client.zrange(keys.tenant_jobs("acme"), 0, -1) == [long_job.id, short[2], fresh.id]
    assert client.zrange(keys.tenant_finished_jobs("acme"), 0, -1) == [short[2], long_job.id]


def test_a_listing_reads_on_past_a_cursor_that_retention_deleted(store: JobStore) -> None:
    jobs = [new_record() for _ in range(3)]
    for record in jobs:
        store.create(record, "queued")
    for index in (1, 2, 0):  # the middle one ends first
        set_status(store, jobs[index].id, JobStatus.SUCCEEDED)
    page, more = store.page("acme", None, 2)
    assert [r.id for r in page] == [jobs[2].id, jobs[1].id] and more
    assert store.create_limited(new_record(), 100, "queued", keep_finished=2)
    assert store.get(jobs[1].id) is None  # deleted: it ended first
    page, more = store.page("acme", jobs[1].id, 2)  # the client's cursor
    assert [r.id for r in page] == [jobs[0].id] and not more


def test_jobs_that_finished_before_the_finished_index_go_by_when_they_ended(
    store: JobStore, client: redis.Redis
) -> None:
    keys = store.keys
    ended = []
    for finished_at in (300, 100, 200):  # created in this order, ended in another
        record = new_record()
        store.create(record, "queued")

        def finish(r: JobRecord, at: int = finished_at) -> JobRecord:
            r.job.status, r.job.finished_at = JobStatus.SUCCEEDED, at
            return r

        store.update(record.id, finish)
        ended.append(record.id)
    # As a registry from before the finished index left them.
    client.delete(keys.tenant_finished_jobs("acme"), keys.tenant_finished_indexed("acme"))
    fresh = new_record()
    assert store.create_limited(fresh, 100, "queued", keep_finished=1)
    assert client.zrange(keys.tenant_jobs("acme"), 0, -1) == [ended[0], fresh.id]
    assert client.zrange(keys.tenant_finished_jobs("acme"), 0, -1) == [ended[0]]
    assert client.get(keys.tenant_finished_indexed("acme")) is not None


def test_a_job_an_older_registry_finished_is_added_and_pruned(
    store: JobStore, client: redis.Redis
) -> None:
    """During a rolling update an older registry finishes jobs without the finished index:
    once the tenant holds more jobs than its indexes, they are added (at most every
    RECHECK_S) and pruned in turn."""
    keys = store.keys
    first, second = new_record(), new_record()
    for record in (first, second):
        store.create(record, "queued")
        set_status(store, record.id, JobStatus.SUCCEEDED)
    assert store.create_limited(new_record(), 100, "queued", keep_finished=5)  # filled once
    client.zrem(keys.tenant_finished_jobs("acme"), first.id)  # as the older registry left it
    assert store.create_limited(new_record(), 100, "queued", keep_finished=1)
    assert first.id in client.zrange(keys.tenant_jobs("acme"), 0, -1)  # not yet: RECHECK_S
    client.set(keys.tenant_finished_indexed("acme"), str(time.time() - RECHECK_S - 1))
    assert store.create_limited(new_record(), 100, "queued", keep_finished=1)
    assert first.id not in client.zrange(keys.tenant_jobs("acme"), 0, -1)
    assert second.id in client.zrange(keys.tenant_jobs("acme"), 0, -1)


def test_late_writes_to_a_deleted_job_create_nothing(
    store: JobStore, client: redis.Redis, namespace: str
) -> None:
    old = new_record()
    store.create(old, "queued")
    set_status(store, old.id, JobStatus.RUNNING)
    store.add_event(old.id, "step 1", "info", "metrics", {"step": 1, "total_steps": 4})
    assert len(store.events(old.id, None, 10)[0]) == 3
    set_status(store, old.id, JobStatus.CANCELLED)
    finish_another(store)
    newer = new_record()
    assert store.create_limited(newer, 100, "queued", keep_finished=1)
    assert store.get(old.id) is None

    before = job_keys(client, namespace)
    store.add_event(old.id, "step 2", "info", "metrics", {"step": 2, "total_steps": 4})
    store.add_event(old.id, "a trainer's error", "error")
    assert store.progress(old.id, 3, 4) is None
    assert store.update(old.id, lambda r: r) is None
    assert job_keys(client, namespace) == before
    assert store.events(old.id, None, 10) == ([], False)
    store.add_event(newer.id, "still written")  # a job that exists gets its events
    assert store.events(newer.id, None, 1)[0][0].message == "still written"


class _Runner:
    """Records the cancels; starts nothing."""

    name = "local"
    poll_every_s = 0.0

    def __init__(self) -> None:
        self.cancelled: list[tuple[str, dict[str, Any]]] = []

    def capacity(self) -> int:
        return 0

    def cancel(self, job_id: str, runner: dict[str, Any]) -> None:
        self.cancelled.append((job_id, runner))


def test_a_dispatcher_stops_the_trainer_of_a_job_deleted_under_it(store: JobStore) -> None:
    """Cancelled through another registry and deleted before this one's next poll: the
    trainer it started still stops."""
    runner = _Runner()
    objects = SimpleNamespace(list_keys=lambda prefix: [], delete=lambda key: None)
    dispatcher = Dispatcher(
        store,
        files=None,  # type: ignore[arg-type]
        adapters=SimpleNamespace(store=objects),  # type: ignore[arg-type]
        runner=runner,  # type: ignore[arg-type]
        settings=FinetuneSettings(),
        model_path="/models/base",
        instance="d" * 32,
        metrics=RegistryMetrics(),
        audit=None,  # type: ignore[arg-type]
    )
    job = new_record()
    store.create(job, "queued")
    set_status(store, job.id, JobStatus.RUNNING)
    dispatcher._owned.add(job.id)  # as its claim leaves it
    set_status(store, job.id, JobStatus.CANCELLED)
    finish_another(store)
    assert store.create_limited(new_record(), 100, "queued", keep_finished=1)
    assert store.get(job.id) is None

    dispatcher.tick()
    assert runner.cancelled == [(job.id, {})]
    assert job.id not in dispatcher._owned


class _Counting:
    """A Redis client that counts the job records read."""

    def __init__(self, client: redis.Redis) -> None:
        self.client, self.read = client, 0

    def get(self, key: str) -> Any:
        self.read += ":ftjob:" in key
        return self.client.get(key)

    def mget(self, keys: list[str]) -> Any:
        self.read += sum(":ftjob:" in k for k in keys)
        return self.client.mget(keys)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_a_metadata_filtered_page_reads_a_bounded_window_and_pages_on(
    client: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs_module, "MATCH_SCAN", 10)
    monkeypatch.setattr(jobs_module, "MATCH_BATCH", 5)
    counting = _Counting(client)
    store = JobStore(counting, RegistryKeys(namespace), 100)
    records = [
        new_record(metadata={"team": "blue" if n in (0, 27, 29) else "red"}) for n in range(30)
    ]
    for record in records:  # records[0] is the oldest
        store.create(record, "queued")

    def blue(r: JobRecord) -> bool:
        return (r.job.metadata or {}).get("team") == "blue"

    found, more = store.page("acme", None, 3, blue)
    assert [r.id for r in found] == [records[29].id, records[27].id] and more
    assert counting.read == 10  # of 30
    # The next page goes on after the last job returned; with no match in its first
    # window it reads on to the next match, which no empty page could point at.
    found, more = store.page("acme", records[27].id, 3, blue)
    assert [r.id for r in found] == [records[0].id] and not more
    # A full page before the window ends is the usual has_more.
    found, more = store.page("acme", None, 1, blue)
    assert [r.id for r in found] == [records[29].id] and more
    # Unfiltered pages are unchanged.
    found, more = store.page("acme", records[2].id, 5)
    assert [r.id for r in found] == [records[1].id, records[0].id] and not more
