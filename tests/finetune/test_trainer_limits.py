"""Trainers are bounded: a job too large for a trainer's memory is refused before it starts
(400 stating the limit, nothing queued), and a trainer that goes over its limit anyway
fails its job with a reason stating the limit, with the registry still serving. Neither
names the setting behind the limit: that is the operator's, not the tenant's."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import redis

from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry.finetune.budget import ModelShape, memory_estimate
from tests.finetune.conftest import Api

JOBS = "/v1/fine_tuning/jobs"


def long_conversations(count: int, chars: int) -> bytes:
    """Conversations of ``chars`` characters each (the toy tokenizer: a token per byte)."""
    return "".join(
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": f"{i} " + "a" * chars},
                    {"role": "assistant", "content": "b" * 16},
                ]
            }
        )
        + "\n"
        for i in range(count)
    ).encode()


def job(api: Api, key: str, file_id: str, batch: int, max_seq_len: int) -> Any:
    return api.call(
        key,
        "POST",
        JOBS,
        json={
            "model": "tiny-llama",
            "training_file": file_id,
            "method": {
                "type": "preft",
                "preft": {
                    "steps": 2,
                    "max_seq_len": max_seq_len,
                    "hyperparameters": {"batch_size": batch},
                },
            },
        },
    )


def test_a_job_too_large_for_a_trainer_is_refused_before_it_starts(api: Api) -> None:
    key = api.tenant("acme")
    long_file = api.upload(key, long_conversations(4, 30_000)).json()["id"]
    refused = job(api, key, long_file, 256, 32768)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "job_too_large" and error["param"] == "hyperparameters"
    assert "batch_size 256" in error["message"] and "PREFT_" not in error["message"]
    assert "a trainer may use on this deployment" in error["message"]
    assert api.call(key, "GET", JOBS).json()["data"] == []

    # The bound follows the file's longest conversation, not only max_seq_len: the same
    # batch on short conversations fits, and so does the long file at batch 1.
    short_file = api.upload(key, long_conversations(4, 40)).json()["id"]
    for file_id, batch in ((short_file, 256), (long_file, 1)):
        accepted = job(api, key, file_id, batch, 32768)
        assert accepted.status_code == 200, accepted.text
        api.call(key, "POST", f"{JOBS}/{accepted.json()['id']}/cancel")


def test_a_trainer_over_its_memory_limit_fails_naming_it(
    serve: Callable[..., Api], redis_server: str, namespace: str
) -> None:
    """The estimate is checked first; should it ever be wrong (here: the file's recorded
    longest line is made to lie), the trainer's own limit still holds."""
    limit = 1 << 30
    api = serve(trainer_memory_bytes=limit)
    key = api.tenant("acme")
    file_id = api.upload(key, long_conversations(8, 20_000)).json()["id"]
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    client.hset(RegistryKeys(namespace).file(file_id), "longest_line", "1")
    client.close()
    shape = ModelShape(hidden=128, intermediate=256, layers=2, vocab=320)  # tiny-llama
    assert memory_estimate(shape, 8, 20_000) > limit  # what the true length would need

    reply = job(api, key, file_id, 8, 32768)
    assert reply.status_code == 200, reply.text
    done = api.wait(
        key,
        reply.json()["id"],
        lambda j: j["status"] not in ("queued", "validating_files", "running"),
        timeout=120,
    )
    assert done["status"] == "failed", done
    message = done["error"]["message"]
    assert "memory limit of 1024 MiB" in message and "PREFT_" not in message, message
    assert "/tmp" not in message and "preft-" not in message  # no scratch paths
    assert api.call(key, "GET", "/v1/adapters").json()["items"] == []
    assert api.call(key, "GET", "/v1/files").status_code == 200  # the registry still serves


def test_a_job_whose_trainer_keeps_no_example_fails_in_the_apis_terms(api: Api) -> None:
    """Create bounds prompts' tokens from below, from bytes; a file it cannot prove hopeless
    (100-byte prompts are 100 tokens to the toy tokenizer, over max_seq_len 16) reaches the
    trainer, whose refusal names the file and the parameter, not its paths or flags."""
    key = api.tenant("acme")
    file_id = api.upload(key, long_conversations(2, 100)).json()["id"]
    reply = job(api, key, file_id, 1, 16)
    assert reply.status_code == 200, reply.text
    done = api.wait(
        key,
        reply.json()["id"],
        lambda j: j["status"] not in ("queued", "validating_files", "running"),
        timeout=120,
    )
    assert done["status"] == "failed", done
    message = done["error"]["message"]
    assert (
        "every example in the training file is longer than method.preft.max_seq_len 16 "
        "tokens: keeping the shortest needs " in message
    ), message
    assert "raise method.preft.max_seq_len to " in message and "(at most 32768)" in message
    assert "/tmp" not in message and "preft-" not in message and "--" not in message
    assert api.call(key, "GET", "/v1/adapters").json()["items"] == []
