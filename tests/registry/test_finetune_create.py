"""Fine-tuning create refuses, before anything is stored or queued, a file whose every
example is certain to be longer than ``max_seq_len`` (its prompts alone fill it), with
advice the tenant can act on; and the trainer's own refusal of such a file reads in the
API's terms, without its scratch paths or command-line flags."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from preft_serve.common.finetune_wire import MAX_SEQ_LEN
from preft_serve.registry.finetune.entry import data_message
from preft_serve.registry.finetune.settings import FinetuneSettings
from preft_serve.training.data import NothingFits, load_dataset
from tests.support.registry_api import create_tenant

JOBS = "/v1/fine_tuning/jobs"


def _conversation(question: str) -> str:
    return (
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": "Fine."},
                ]
            }
        )
        + "\n"
    )


@pytest.fixture
def ft_client(make_client: Callable[..., TestClient], tmp_path: Path) -> TestClient:
    """The registry with a dispatcher that never ticks again after start: a job created
    here stays queued, no trainer runs."""
    return make_client(finetune=FinetuneSettings(poll_s=60, work_dir=tmp_path))


@pytest.fixture
def key(ft_client: TestClient) -> str:
    """A tenant made through ``ft_client``: no other registry (and dispatcher) starts."""
    return create_tenant(ft_client, "acme")["Authorization"].removeprefix("Bearer ")


def _upload(client: TestClient, key: str, content: str) -> str:
    reply = client.post(
        "/v1/files",
        headers={"Authorization": f"Bearer {key}"},
        data={"purpose": "fine-tune"},
        files={"file": ("train.jsonl", content.encode(), "application/jsonl")},
    )
    assert reply.status_code == 200, reply.text
    return str(reply.json()["id"])


def _create(client: TestClient, key: str, file_id: str, max_seq_len: int) -> Any:
    return client.post(
        JOBS,
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": "tiny-llama",
            "training_file": file_id,
            "method": {"type": "preft", "preft": {"max_seq_len": max_seq_len}},
        },
    )


@pytest.mark.parametrize(
    ("question_bytes", "max_seq_len", "raise_offered"),
    [
        (8_000, 64, True),
        # Past what the largest max_seq_len holds: raising it is not offered.
        (900_000, MAX_SEQ_LEN, False),
    ],
)
def test_a_file_whose_every_prompt_fills_max_seq_len_is_refused_at_create(
    ft_client: TestClient,
    key: str,
    state_snapshot: Callable[[], dict[str, Any]],
    question_bytes: int,
    max_seq_len: int,
    raise_offered: bool,
) -> None:
    file_id = _upload(
        ft_client,
        key,
        _conversation("a" * question_bytes) + _conversation("b" * (question_bytes + 10)),
    )
    before = state_snapshot()

    refused = _create(ft_client, key, file_id, max_seq_len)

    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "examples_too_long" and error["param"] == "training_file"
    message = error["message"]
    assert message.startswith(
        f"every example in file {file_id} is longer than "
        f"method.preft.max_seq_len {max_seq_len} tokens: keeping the "
        "shortest needs at least "
    )
    if raise_offered:
        assert "raise method.preft.max_seq_len to " in message
        assert f"or more (at most {MAX_SEQ_LEN})" in message
    else:
        assert "raise" not in message
        assert f"even the largest method.preft.max_seq_len, {MAX_SEQ_LEN}, cannot" in message
    assert "PREFT_" not in message and "--" not in message
    # Nothing stored, nothing queued: Redis and the bucket are as they were.
    assert state_snapshot() == before
    listed = ft_client.get(JOBS, headers={"Authorization": f"Bearer {key}"}).json()
    assert listed["data"] == []


def test_a_file_with_one_example_that_fits_is_accepted(ft_client: TestClient, key: str) -> None:
    file_id = _upload(ft_client, key, _conversation("a" * 8_000) + _conversation("Hi?"))
    created = _create(ft_client, key, file_id, 64)
    assert created.status_code == 200, created.text
    assert created.json()["status"] == "queued"


def test_a_validation_file_that_keeps_nothing_is_refused_by_name(
    ft_client: TestClient, key: str, state_snapshot: Callable[[], dict[str, Any]]
) -> None:
    training = _upload(ft_client, key, _conversation("Hi?"))
    validation = _upload(ft_client, key, _conversation("v" * 8_000))
    before = state_snapshot()
    refused = ft_client.post(
        JOBS,
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": "tiny-llama",
            "training_file": training,
            "validation_file": validation,
            "method": {"type": "preft", "preft": {"max_seq_len": 64}},
        },
    )
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "validation_file"
    assert error["message"].startswith(f"every example in file {validation} is longer")
    assert state_snapshot() == before


@pytest.mark.parametrize("max_seq_len", [16, MAX_SEQ_LEN])
def test_the_trainers_refusal_names_the_file_and_the_api_parameter(
    base_model_dir: Path, tmp_path: Path, max_seq_len: int
) -> None:
    """The trainer's check (for what create could not prove): the job's error names the
    file by its role and method.preft.max_seq_len, never a path or a flag, and offers a
    raise only up to the largest value a job may ask."""
    from transformers import AutoTokenizer

    data = tmp_path / "preft-trainer-x" / "train.jsonl"
    data.parent.mkdir()
    question = "q" * (max_seq_len if max_seq_len < MAX_SEQ_LEN else MAX_SEQ_LEN + 100)
    data.write_text(_conversation(question))
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    with pytest.raises(NothingFits) as info:
        load_dataset(data, tokenizer, max_seq_len)
    needed = info.value.needed
    assert needed > max_seq_len

    message = data_message(info.value, {data: "the training file"})

    assert message.startswith(
        "every example in the training file is longer than "
        f"method.preft.max_seq_len {max_seq_len} tokens: keeping the "
        f"shortest needs {needed} "
    )
    assert str(tmp_path) not in message and "--" not in message
    if needed <= MAX_SEQ_LEN:
        assert f"raise method.preft.max_seq_len to {needed} or more" in message
    else:
        assert "raise" not in message


def test_a_job_for_an_adapter_at_its_version_limit_is_refused_at_create(
    make_client: Callable[..., TestClient],
    tmp_path: Path,
    lora_dir: Path,
    state_snapshot: Callable[[], dict[str, Any]],
) -> None:
    """Refused before it trains for hours to a version that could not be registered."""
    from tests.support.registry_api import upload

    client = make_client(
        finetune=FinetuneSettings(poll_s=60, work_dir=tmp_path), max_versions_per_adapter=1
    )
    headers = create_tenant(client, "acme")
    key = headers["Authorization"].removeprefix("Bearer ")
    assert upload(client, headers, "bot", lora_dir).status_code == 201
    file_id = _upload(client, key, _conversation("Hi?"))
    before = state_snapshot()
    refused = client.post(
        JOBS,
        headers=headers,
        json={"model": "tiny-llama", "training_file": file_id, "suffix": "bot"},
    )
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded"
    assert "adapter 'bot' already has 1 versions" in error["message"]
    assert state_snapshot() == before
    other = client.post(
        JOBS,
        headers=headers,
        json={"model": "tiny-llama", "training_file": file_id, "suffix": "fresh"},
    )
    assert other.status_code == 200, other.text
