"""The fast parts of OpenAI fine-tuning parity, without a trainer: the per-step CSV result
file, ``estimated_finish`` from a running job's progress, the ``metadata[k]=v`` list
filter's parsing, and what ``auto`` epochs come to for a file's size."""

from __future__ import annotations

import math
import time
import uuid

import pytest
import redis
from starlette.datastructures import QueryParams

from preft_serve.common.domain_errors import InvalidRequest
from preft_serve.common.finetune_wire import FineTuningJob, JobCreate, JobStatus
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry.finetune.jobs import JobRecord, JobStore, estimate_finish
from preft_serve.registry.finetune.resolve import resolve
from preft_serve.registry.finetune.results import step_metrics_csv
from preft_serve.registry.routers.fine_tuning import metadata_filter


def test_the_result_csv_has_openais_columns_the_recorded_values_and_no_paths() -> None:
    metrics = {
        "config": {"data": "/srv/scratch/train.jsonl", "model": "/models/base"},
        "train_loss": [
            {"step": 1, "loss": 2.5, "lr": 1e-3},
            {"step": 2, "loss": 1.25},
            {"step": 3, "loss": float("nan")},
        ],
        "eval_loss": [{"step": 2, "loss": 1.5}, {"step": 3, "loss": 1.0}],
    }
    assert step_metrics_csv(metrics).decode() == (
        "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy\n"
        "1,2.5,,,\n"
        "2,1.25,,1.5,\n"
        "3,,,1.0,\n"
    )
    assert step_metrics_csv({}).decode().count("\n") == 1  # the header alone


def test_estimated_finish_is_the_pace_so_far() -> None:
    assert estimate_finish(1000.0, 1010.0, 5, 20) == 1040
    assert estimate_finish(1000.0, 1010.0, 20, 20) == 1010
    assert estimate_finish(1000.0, 1010.0, 0, 20) is None


@pytest.fixture
def store(redis_client: redis.Redis) -> JobStore:
    return JobStore(redis_client, RegistryKeys(f"t{uuid.uuid4().hex[:8]}"), 100)


def _record(status: JobStatus, started_at: float | None) -> JobRecord:
    job = FineTuningJob(
        id=f"ftjob-{uuid.uuid4().hex[:24]}",
        created_at=int(time.time()),
        model="m",
        organization_id="acme",
        status=status,
        training_file="file-x",
        hyperparameters={},
        seed=0,
        method={},
    )
    return JobRecord(
        job=job, tenant="acme", adapter_name="a", training_sha256="0" * 64, started_at=started_at
    )


def test_a_running_jobs_progress_sets_its_estimate_and_nothing_else_does(store: JobStore) -> None:
    running = _record(JobStatus.RUNNING, time.time() - 30)
    store.create(running, "queued")
    store.progress(running.id, 10, 40)
    found = store.get(running.id)
    assert found is not None and found.job.estimated_finish is not None
    assert abs(found.job.estimated_finish - (running.started_at or 0) - 120) <= 2
    for status in (JobStatus.QUEUED, JobStatus.SUCCEEDED):
        other = _record(status, time.time() - 30)
        store.create(other, "queued")
        assert store.progress(other.id, 10, 40) is None
        assert (read := store.get(other.id)) is not None and read.job.estimated_finish is None


def test_jobs_list_newest_first_when_created_at_and_the_write_straddle_a_second(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The older job is stamped 12 s and written at 12.5 s; the newer one stamped 12 s too
    # but written at 13.001 s (a slow moment between stamping and writing).
    older, newer = _record(JobStatus.QUEUED, None), _record(JobStatus.QUEUED, None)
    older.job.created_at = newer.job.created_at = 12
    for record, now_s in ((older, 12.5), (newer, 13.001)):
        monkeypatch.setattr(time, "time", lambda now_s=now_s: now_s)
        monkeypatch.setattr(time, "time_ns", lambda now_s=now_s: int(now_s * 1e9))
        store.create(record, "queued")
    monkeypatch.undo()
    jobs, more = store.page("acme", None, 10)
    assert [j.id for j in jobs] == [newer.id, older.id] and not more
    assert [j.id for j in store.page("acme", newer.id, 10)[0]] == [older.id]


def test_the_metadata_filter_reads_openais_deep_object_form() -> None:
    assert metadata_filter(QueryParams("limit=5")) is None
    assert metadata_filter(QueryParams("metadata%5Bteam%5D=blue&metadata%5Brun%5D=")) == {
        "team": "blue",
        "run": "",
    }
    assert metadata_filter(QueryParams("metadata=null")) == "null"
    for bad in (
        "metadata=x",
        "metadata=null&metadata%5Ba%5D=b",
        "&".join(f"metadata%5Bk{i}%5D=v" for i in range(17)),
    ):
        with pytest.raises(InvalidRequest):
            metadata_filter(QueryParams(bad))


@pytest.mark.parametrize(
    "examples, epochs, steps, multiplier",
    [
        (4, 16, 16, 2.5),  # one step an epoch: 16 passes, at the small-file rate
        (9, 8, 16, 2.5),  # the demo's 9 facts, batches of 8: two steps an epoch
        (40, 4, 20, 1.0),  # more than 16 steps: the default rate
        (100, 3, 39, 1.0),  # enough steps in 3 epochs: 3, as for any larger file
        (1000, 3, 375, 1.0),
    ],
)
def test_auto_gives_a_small_file_at_least_16_steps_at_a_higher_rate(
    examples: int, epochs: int, steps: int, multiplier: float
) -> None:
    body = JobCreate.model_validate({"model": "m", "training_file": "file-1"})
    options, hyper, _ = resolve(
        body, examples, seed=0, max_steps=10_000, max_lora_rank=64, max_reft_rank=32
    )
    assert (options["epochs"], hyper["n_epochs"]) == (epochs, epochs)
    assert epochs * math.ceil(examples / options["batch_size"]) == steps
    assert hyper["learning_rate_multiplier"] == multiplier
    assert options["learning_rate"] == pytest.approx(2e-3 * multiplier)


def test_chosen_epochs_are_kept() -> None:
    body = JobCreate.model_validate(
        {"model": "m", "training_file": "file-1", "hyperparameters": {"n_epochs": 2}}
    )
    options, _, _ = resolve(body, 4, seed=0, max_steps=10_000, max_lora_rank=64, max_reft_rank=32)
    assert options["epochs"] == 2
