"""A fine-tuning create (and a file delete) reads its own tenant's queued and running jobs,
nothing else: the per-tenant active index (``tenant_active_jobs``) bounds the work of each,
however many jobs other tenants run. Active jobs of a registry from before the index, or
created by an older one during a rolling update, are added to it, never a job that ended;
an entry of a job that ended is dropped when a create reads it."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from preft_serve.common.finetune_wire import JobStatus
from preft_serve.registry.finetune.jobs import JobStore
from tests.finetune.test_retention import new_record, set_status


def test_a_create_reads_none_of_the_other_tenants_jobs(
    store: JobStore, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    others = [new_record(f"tenant-{n:03d}") for n in range(200)]
    for record in others:
        assert store.create_limited(record, 4, "queued", keep_finished=10)
    mine = new_record()
    assert store.create_limited(mine, 4, "queued", keep_finished=10)

    commands: list[tuple[Any, ...]] = []
    real_pipeline = client.pipeline

    def recording_pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = real_pipeline(*args, **kwargs)
        run = pipe.execute_command

        def execute_command(*command: Any, **options: Any) -> Any:
            commands.append(command)
            return run(*command, **options)

        pipe.execute_command = execute_command  # type: ignore[method-assign]
        return pipe

    monkeypatch.setattr(client, "pipeline", recording_pipeline)
    assert store.create_limited(new_record(), 4, "queued", keep_finished=10)
    touched = " ".join(str(part) for command in commands for part in command)
    assert mine.id in touched  # its own active job was read
    assert not any(record.id in touched for record in others)
    assert "tenant-" not in touched
    assert len(commands) < 20


def test_the_limit_counts_active_jobs_from_before_the_index(
    store: JobStore, client: redis.Redis
) -> None:
    keys = store.keys
    queued, running = new_record(), new_record()
    for record in (queued, running):
        store.create(record, "queued")
    set_status(store, running.id, JobStatus.RUNNING)
    # As a registry from before the per-tenant index left them.
    client.delete(keys.tenant_active_jobs("acme"), keys.active_jobs_by_tenant)
    assert not store.create_limited(new_record(), 2, "queued")
    assert client.zrange(keys.tenant_active_jobs("acme"), 0, -1) == [queued.id, running.id]
    assert client.get(keys.active_jobs_by_tenant) == "1"
    set_status(store, queued.id, JobStatus.CANCELLED)  # leaves both indexes
    assert client.zrange(keys.tenant_active_jobs("acme"), 0, -1) == [running.id]
    assert store.create_limited(new_record(), 2, "queued")


def test_an_entry_of_a_job_that_ended_is_dropped_when_read(
    store: JobStore, client: redis.Redis
) -> None:
    """As the one-time fill can leave: the job ended after the fill read it as active."""
    keys = store.keys
    ended = new_record()
    assert store.create_limited(ended, 1, "queued")
    set_status(store, ended.id, JobStatus.SUCCEEDED)
    client.zadd(keys.tenant_active_jobs("acme"), {ended.id: 1})
    fresh = new_record()
    assert store.create_limited(fresh, 1, "queued")  # the ended job does not count
    assert client.zrange(keys.tenant_active_jobs("acme"), 0, -1) == [fresh.id]


def test_jobs_an_older_registry_creates_are_added_and_ended_ones_never(
    store: JobStore, client: redis.Redis
) -> None:
    """During a rolling update an older registry creates jobs in the global index only;
    the dispatcher's periodic repair (``index_active``) adds them to their tenant's, and
    never adds back a job that ended."""
    keys = store.keys
    assert store.create_limited(new_record(), 2, "queued")  # the index is in use
    older = new_record()
    store.create(older, "queued")
    client.zrem(keys.tenant_active_jobs("acme"), older.id)  # as the older registry wrote it
    ended = new_record()
    store.create(ended, "queued")
    set_status(store, ended.id, JobStatus.FAILED)
    store.index_active([*store.active(), ended])
    assert older.id in client.zrange(keys.tenant_active_jobs("acme"), 0, -1)
    assert ended.id not in client.zrange(keys.tenant_active_jobs("acme"), 0, -1)
    assert not store.create_limited(new_record(), 2, "queued")  # both active ones count


def test_a_file_delete_reads_its_own_tenants_jobs(store: JobStore) -> None:
    reading = new_record()
    store.create(reading, "queued")
    store.create(new_record("beta"), "queued")
    assert store.using_file("acme", "file-x") == [reading.id]
    assert store.using_file("acme", "file-y") == []
    set_status(store, reading.id, JobStatus.CANCELLED)
    assert store.using_file("acme", "file-x") == []
