"""A fine-tuning job stores its trained adapter as a staged version by default
(``method.preft.promote: false``): the adapter's name keeps serving the version it served,
and the new one is promoted later (``POST /v1/adapters/{name}/versions/{version}/promote``).
A real trainer runs (two steps on the toy model)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.finetune.conftest import Api, chat_jsonl

JOBS = "/v1/fine_tuning/jobs"


def _upload_adapter(api: Api, key: str, model_dir: Path, tmp_path: Path) -> str:
    """Version 1 of adapter ``bot``, uploaded (served); returns its sha256."""
    from preft_serve.toymodels import make_lora_adapter

    folder = make_lora_adapter(model_dir, tmp_path / "bot", seed=3)
    files = [
        ("files", (p.name, p.read_bytes(), "application/octet-stream"))
        for p in sorted(folder.iterdir())
    ]
    reply = api.call(
        key, "POST", "/v1/adapters", data={"name": "bot", "mode": "prefill"}, files=files
    )
    assert reply.status_code == 201, reply.text
    return str(reply.json()["sha256"])


def _policy(api: Api, key: str) -> dict[str, Any]:
    reply = api.call(key, "GET", "/v1/adapters/bot/policy")
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


def _job(api: Api, key: str, file_id: str, preft: dict[str, Any]) -> dict[str, Any]:
    reply = api.call(
        key,
        "POST",
        JOBS,
        json={
            "model": "tiny-llama",
            "training_file": file_id,
            "suffix": "bot",
            "method": {"type": "preft", "preft": {"steps": 2, **preft}},
        },
    )
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


def test_the_default_stages_the_trained_version_and_serving_is_unchanged(
    serve: Callable[..., Api], model_dir: Path, tmp_path: Path
) -> None:
    api = serve(max_steps=60)
    key = api.tenant("acme")
    served_sha = _upload_adapter(api, key, model_dir, tmp_path)
    bound = api.call(key, "PUT", "/v1/users/alice", json={"adapter": "bot"})
    assert bound.status_code == 200, bound.text
    file_id = api.upload(key, chat_jsonl()).json()["id"]

    created = _job(api, key, file_id, {})
    assert created["method"]["preft"]["promote"] is False  # the default, read back
    job = api.wait(key, created["id"], lambda j: j["status"] in ("failed", "succeeded"))
    assert job["status"] == "succeeded", job
    assert job["fine_tuned_model"] == "bot"

    policy = _policy(api, key)
    assert (policy["version"], policy["sha256"], policy["canary"]) == (1, served_sha, None)
    states = {v["version"]: v["state"] for v in policy["versions"]}
    assert states == {1: "serving", 2: "staged"}
    assert api.call(key, "GET", "/v1/users/alice").json()["version"] == 1
    checkpoints = api.call(key, "GET", f"{JOBS}/{job['id']}/checkpoints").json()["data"]
    assert [c["fine_tuned_model_checkpoint"] for c in checkpoints] == ["bot@2"]
    events = api.call(key, "GET", f"{JOBS}/{job['id']}/events").json()["data"]
    created_event = next(e for e in events if "New fine-tuned model" in e["message"])
    assert "staged" in created_event["message"]
    assert "/v1/adapters/bot/versions/2/promote" in created_event["message"]

    # Promoting it serves it: the staged version was the trained one.
    promoted = api.call(key, "POST", "/v1/adapters/bot/versions/2/promote")
    assert promoted.status_code == 200, promoted.text
    assert promoted.json()["version"] == 2
    assert promoted.json()["sha256"] != served_sha


def test_promote_true_serves_the_trained_version_at_once(
    serve: Callable[..., Api], model_dir: Path, tmp_path: Path
) -> None:
    api = serve(max_steps=60)
    key = api.tenant("acme")
    served_sha = _upload_adapter(api, key, model_dir, tmp_path)
    file_id = api.upload(key, chat_jsonl()).json()["id"]
    created = _job(api, key, file_id, {"promote": True})
    assert created["method"]["preft"]["promote"] is True
    job = api.wait(key, created["id"], lambda j: j["status"] in ("failed", "succeeded"))
    assert job["status"] == "succeeded", job
    policy = _policy(api, key)
    assert policy["version"] == 2 and policy["sha256"] != served_sha
    states = {v["version"]: v["state"] for v in policy["versions"]}
    assert states == {1: "retired", 2: "serving"}


@pytest.mark.parametrize("value", ["no", 0, None, "false"])
def test_a_promote_that_is_not_a_boolean_is_refused_and_nothing_is_queued(
    serve: Callable[..., Api], value: Any
) -> None:
    api = serve()
    key = api.tenant("acme")
    file_id = api.upload(key, chat_jsonl()).json()["id"]
    reply = api.call(
        key,
        "POST",
        JOBS,
        json={
            "model": "tiny-llama",
            "training_file": file_id,
            "method": {"type": "preft", "preft": {"promote": value}},
        },
    )
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["param"] == "method.preft.promote"
    assert error["message"] == (
        "invalid request: method.preft.promote: Input should be a valid boolean"
    )
    assert api.call(key, "GET", JOBS).json()["data"] == []
