"""The whole path with real processes and the official ``openai`` client, unchanged, on
one base URL, the gateway's (which forwards files and fine-tuning to the registry):
upload JSONL -> create a job on the toy model -> events stream progress -> the job
succeeds -> bind a user to its ``fine_tuned_model`` -> the trained adapter is listed in
/v1/models -> the gateway's greedy chat answer (a real vLLM worker) equals the HF+peft
oracle of the trained adapter, and is the fact it was trained on -> retrieve the model,
delete it (refused while a user is bound to it). The registry runs
in-process over HTTP; its trainer, the worker and the gateway are separate processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from preft_serve.common.objectstore import LocalObjectStore
from tests.e2e.stack import BASE_NAME, Base, running_gateway, worker_args
from tests.engine import oracle
from tests.finetune.conftest import FACTS, Api, chat_jsonl
from tests.support.worker_process import running_worker


def test_openai_client_fine_tunes_and_the_gateway_serves_it(
    serve: Callable[..., Api],
    model_dir: Path,
    tmp_path: Path,
    redis_server: str,
    namespace: str,
) -> None:
    api = serve()
    key = api.tenant("acme")
    base = Base(tmp_path, model_dir, tmp_path / "objects")
    # The worker starts while the job trains (both take a while on 2 cores).
    with (
        running_worker(model_dir, tmp_path, worker_args(base, "cache")) as worker,
        running_gateway(
            tmp_path,
            redis_server,
            namespace,
            model_dir,
            [worker],
            extra_env={"PREFT_GATEWAY_REGISTRY_URL": api.url},
        ) as gw,
    ):
        check(api, key, gw.url, model_dir, tmp_path)


def check(api: Api, key: str, gateway: str, model_dir: Path, tmp_path: Path) -> None:
    # One client for everything the OpenAI API covers; binding users is the registry's own.
    client = OpenAI(
        base_url=f"{gateway}/v1", api_key=key, max_retries=0, http_client=httpx.Client(timeout=120)
    )

    uploaded = client.files.create(file=("facts.jsonl", chat_jsonl()), purpose="fine-tune")
    assert uploaded.id.startswith("file-") and uploaded.purpose == "fine-tune"
    assert client.files.retrieve(uploaded.id).bytes == len(chat_jsonl())
    started = time.monotonic()
    job = client.fine_tuning.jobs.create(
        model=BASE_NAME,
        training_file=uploaded.id,
        suffix="facts",
        seed=0,
        hyperparameters={"batch_size": len(FACTS), "learning_rate_multiplier": 5},
        method={
            "type": "preft",
            "preft": {
                "adapter": "lora",
                "mode": "prefill",  # type: ignore[typeddict-item,typeddict-unknown-key]
                "rank": 8,
                "steps": 60,
            },
        },
    )
    assert job.status == "queued" and job.id.startswith("ftjob-")
    steps: list[int] = []
    while (job := client.fine_tuning.jobs.retrieve(job.id)).status not in (
        "succeeded",
        "failed",
        "cancelled",
    ):
        assert time.monotonic() - started < 180, job
        time.sleep(0.5)
    trained_s = time.monotonic() - started
    assert job.status == "succeeded", job.error
    assert job.fine_tuned_model == "facts" and job.trained_tokens and job.finished_at
    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    metrics = [e for e in events if e.type == "metrics"]
    steps = [e.data["step"] for e in reversed(metrics)]  # type: ignore[index]
    assert steps == sorted(steps) and steps[-1] == 60 and len(steps) >= 5, steps
    first, last = metrics[-1].data, metrics[0].data
    assert last["train_loss"] < first["train_loss"] / 4  # type: ignore[index]
    assert events[0].message == "The job has successfully completed"
    assert [j.id for j in client.fine_tuning.jobs.list().data] == [job.id]
    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert (
        checkpoints[0].step_number == 60 and checkpoints[0].fine_tuned_model_checkpoint == "facts@1"
    )
    assert client.files.retrieve(job.result_files[0]).purpose == "fine-tune-results"

    bound = api.call(key, "PUT", "/v1/users/dana", json={"adapter": job.fine_tuned_model})
    assert bound.status_code == 200, bound.text
    adapter = api.call(key, "GET", "/v1/adapters/facts").json()
    assert adapter["type"] == "lora" and adapter["mode"] == "prefill"
    trained = LocalObjectStore(tmp_path / "objects").fetch_adapter(
        adapter["sha256"], tmp_path / "trained"
    )

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    assert "facts" in [m.id for m in client.models.list().data]
    for question, answer in FACTS.items():
        want = answer + "\n"  # the toy template ends a turn with "\n" (one token)
        reply = client.chat.completions.create(
            model=BASE_NAME,
            user="dana",
            temperature=0,
            max_tokens=len(want),
            messages=[{"role": "user", "content": question}],
        )
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        expected = oracle.generate_prefill(model_dir, trained, prompt, len(want))
        assert reply.choices[0].message.content == tokenizer.decode(expected)
        assert reply.choices[0].message.content == want
        assert reply.model == "facts"
    assert client.models.retrieve("facts").id == "facts"
    # Deleting a model users are bound to is refused (the registry's check), then works.
    with pytest.raises(openai.ConflictError):
        client.models.delete("facts")
    assert api.call(key, "DELETE", "/v1/users/dana").status_code == 204
    assert client.models.delete("facts").deleted
    assert "facts" not in [m.id for m in client.models.list().data]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("facts")
    print(f"job on the toy model: {trained_s:.1f} s from create to succeeded")
