"""OpenAI's fine-tuning API as the official client uses it: ``metadata`` stored and
filtered, ``integrations`` refused rather than dropped, ``method.type`` read back as sent,
``hyperparameters`` as used, ``estimated_finish``, and the per-step CSV result file.

The dispatcher polls once a minute here, so created jobs stay queued (no trainer runs)
except in the one test that trains."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from openai import BadRequestError, OpenAI

from tests.finetune.conftest import Api, chat_jsonl

JOBS = "/v1/fine_tuning/jobs"


def client_of(api: Api, key: str) -> OpenAI:
    return OpenAI(base_url=f"{api.url}/v1", api_key=key, max_retries=0, timeout=60)


@pytest.fixture
def idle(serve: Callable[..., Api]) -> Api:
    """A registry whose dispatcher does not start jobs during a test."""
    return serve(poll_s=60, tenant_max_queued=20, max_steps=60)


def test_metadata_is_stored_returned_and_filtered_as_openai_does(idle: Api) -> None:
    key = idle.tenant("acme")
    client = client_of(idle, key)
    file_id = idle.upload(key, chat_jsonl()).json()["id"]

    def create(metadata: dict[str, str] | None) -> str:
        return client.fine_tuning.jobs.create(
            model="tiny-llama", training_file=file_id, metadata=metadata
        ).id

    blue = create({"team": "blue", "run": "1"})
    plain = create(None)
    red = create({"team": "red"})
    blue2 = create({"team": "blue", "run": "2"})
    assert client.fine_tuning.jobs.retrieve(blue).metadata == {"team": "blue", "run": "1"}
    assert client.fine_tuning.jobs.retrieve(plain).metadata is None

    def listed(**query: Any) -> list[str]:
        return [j.id for j in client.fine_tuning.jobs.list(**query).data]

    assert listed(metadata={"team": "blue"}) == [blue2, blue]
    assert listed(metadata={"team": "blue", "run": "1"}) == [blue]
    assert listed(metadata={"team": "green"}) == []
    assert listed(metadata={"team": "red"}) == [red]
    assert listed() == [blue2, red, plain, blue]
    page = client.fine_tuning.jobs.list(metadata={"team": "blue"}, limit=1)
    assert [j.id for j in page.data] == [blue2] and page.has_more
    assert listed(metadata={"team": "blue"}, after=blue2) == [blue]
    null = idle.call(key, "GET", JOBS, params={"metadata": "null"}).json()["data"]
    assert [j["id"] for j in null] == [plain]
    both = idle.call(key, "GET", JOBS, params={"metadata": "null", "metadata[team]": "red"})
    assert both.status_code == 400 and both.json()["error"]["param"] == "metadata"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata has 17 pairs; at most 16"),
        ({"metadata": {"k" * 65: "v"}}, "is over 64 characters"),
        ({"metadata": {"k": "v" * 513}}, "metadata['k'] is over 512 characters"),
        (
            {"integrations": [{"type": "wandb", "wandb": {"project": "p"}}]},
            "integrations are not supported",
        ),
    ],
)
def test_metadata_over_openais_bounds_and_integrations_are_refused_storing_nothing(
    idle: Api, extra: dict[str, Any], message: str
) -> None:
    key = idle.tenant("acme")
    file_id = idle.upload(key, chat_jsonl()).json()["id"]
    reply = idle.call(
        key, "POST", JOBS, json={"model": "tiny-llama", "training_file": file_id, **extra}
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert message in error["message"] and error["param"] == next(iter(extra))
    assert idle.call(key, "GET", JOBS).json()["data"] == []


def test_no_integrations_and_sixteen_pairs_are_accepted(idle: Api) -> None:
    key = idle.tenant("acme")
    file_id = idle.upload(key, chat_jsonl()).json()["id"]
    pairs = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    reply = idle.call(
        key,
        "POST",
        JOBS,
        json={
            "model": "tiny-llama",
            "training_file": file_id,
            "integrations": [],
            "metadata": pairs,
        },
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["metadata"] == pairs


def test_method_type_reads_back_as_sent_and_hyperparameters_as_used(idle: Api) -> None:
    key = idle.tenant("acme")
    client = client_of(idle, key)
    file_id = idle.upload(key, chat_jsonl()).json()["id"]  # two conversations
    supervised = client.fine_tuning.jobs.create(
        model="tiny-llama",
        training_file=file_id,
        method={"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 2}}},
        extra_body={"preft": {"adapter": "lora", "rank": 4, "steps": 7}},
    )
    read = client.fine_tuning.jobs.retrieve(supervised.id)
    assert read.method is not None and read.method.type == "supervised"
    assert read.method.supervised is not None
    assert read.method.supervised.hyperparameters is not None
    assert read.method.supervised.hyperparameters.batch_size == 2
    preft = read.method.model_dump()["preft"]  # the options it trains with
    assert (preft["adapter"], preft["rank"], preft["steps"]) == ("lora", 4, 7)
    # 7 steps of a batch of 2 over 2 conversations: 7 passes, not the default 3.
    assert read.hyperparameters.n_epochs == 7 and read.hyperparameters.batch_size == 2
    assert read.estimated_finish is None  # queued

    plain = idle.call(
        key,
        "POST",
        JOBS,
        json={"model": "tiny-llama", "training_file": file_id, "method": {"type": "supervised"}},
    )
    assert plain.json()["method"]["type"] == "supervised"
    assert plain.json()["method"]["preft"]["adapter"] == "lora"
    # auto: 2 conversations in a batch of 2 is one step an epoch: 16 epochs, 16 steps.
    assert plain.json()["hyperparameters"]["n_epochs"] == 16
    ours = idle.call(
        key,
        "POST",
        JOBS,
        json={
            "model": "tiny-llama",
            "training_file": file_id,
            "method": {"type": "preft", "preft": {"adapter": "direft", "rank": 2}},
        },
    ).json()
    assert ours["method"]["type"] == "preft" and ours["method"]["preft"]["adapter"] == "direft"
    assert "supervised" not in ours["method"]

    with pytest.raises(BadRequestError) as twice:
        client.fine_tuning.jobs.create(
            model="tiny-llama",
            training_file=file_id,
            method={"type": "preft", "preft": {"rank": 4}},  # type: ignore[arg-type]
            extra_body={"preft": {"rank": 4}},
        )
    assert "give the PreFT options once" in str(twice.value)
    assert len(client.fine_tuning.jobs.list().data) == 3


def test_a_trained_job_reads_back_its_result_csv_and_no_estimate(
    serve: Callable[..., Api],
) -> None:
    api = serve(max_steps=60)
    key = api.tenant("acme")
    client = client_of(api, key)
    file_id = api.upload(key, chat_jsonl()).json()["id"]
    validation = api.upload(key, chat_jsonl(), "valid.jsonl").json()["id"]
    job_id = client.fine_tuning.jobs.create(
        model="tiny-llama",
        training_file=file_id,
        validation_file=validation,
        method={"type": "supervised"},
        extra_body={"preft": {"steps": 3}},
    ).id
    job = api.wait(key, job_id, lambda j: j["status"] in ("failed", "succeeded"))
    assert job["status"] == "succeeded", job
    assert job["estimated_finish"] is None and job["method"]["type"] == "supervised"
    result = client.files.retrieve(job["result_files"][0])
    assert result.filename == f"{job_id}-step_metrics.csv"
    text = client.files.content(result.id).text
    lines = text.splitlines()
    assert lines[0] == "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy"
    rows = [line.split(",") for line in lines[1:]]
    assert [r[0] for r in rows] == ["1", "2", "3"]
    assert all(float(r[1]) > 0 and r[2] == "" and r[4] == "" for r in rows)
    assert rows[0][3] == "" and float(rows[2][3]) > 0  # evaluated at the end
    assert "/" not in text
