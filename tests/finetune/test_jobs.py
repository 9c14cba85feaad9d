"""Job lifecycle with real trainer processes: cancel mid-run, a trainer that dies, a
registry killed mid-job and restarted, per-tenant limits (429), tenant scoping (404) and
request checks. Jobs here are long on purpose; each test stops them."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from preft_serve.common.finetune_wire import JobStatus
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.registry.finetune.jobs import JobRecord
from preft_serve.registry.finetune.spec import OUTPUT_FILES
from tests.finetune.conftest import Api, chat_jsonl
from tests.support.ports import free_port
from tests.support.processes import service
from tests.support.registry_api import ADMIN_TOKEN

LONG = {"model": "tiny-llama", "method": {"type": "preft", "preft": {"steps": 5000}}}


def record(redis_url: str, namespace: str, job_id: str) -> JobRecord:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        raw = client.get(RegistryKeys(namespace).job(job_id))
    finally:
        client.close()
    assert raw is not None
    return JobRecord.model_validate_json(raw)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


def wait_gone(pid: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _start_job(api: Api, key: str, file_id: str, steps: int, **extra: Any) -> str:
    """Create a PreFT job of ``steps`` on ``file_id`` (``extra``: more request fields); its id."""
    return str(
        api.call(
            key,
            "POST",
            "/v1/fine_tuning/jobs",
            json={
                "model": "tiny-llama",
                "training_file": file_id,
                "method": {"type": "preft", "preft": {"steps": steps}},
                **extra,
            },
        ).json()["id"]
    )


def start_long_job(
    api: Api, key: str, redis_url: str, namespace: str, **extra: Any
) -> tuple[str, int]:
    """A job that is training (the trainer reported its adapter, the line before step 1);
    returns (job id, trainer pid)."""
    file_id = api.upload(key, chat_jsonl()).json()["id"]
    reply = api.call(
        key, "POST", "/v1/fine_tuning/jobs", json={**LONG, "training_file": file_id, **extra}
    )
    assert reply.status_code == 200, reply.text
    job_id = reply.json()["id"]
    deadline = time.monotonic() + 120
    while True:
        events = api.call(key, "GET", f"/v1/fine_tuning/jobs/{job_id}/events").json()["data"]
        if any(e["message"].startswith("adapter: ") for e in events):
            break
        assert time.monotonic() < deadline, events
        time.sleep(0.3)
    pid = record(redis_url, namespace, job_id).runner["pid"]
    assert alive(pid)
    return job_id, pid


def test_cancel_mid_run_limits_and_scoping(
    serve: Callable[..., Api], redis_server: str, namespace: str, tmp_path: Path
) -> None:
    api = serve(tenant_max_running=1, tenant_max_queued=1)
    key, other = api.tenant("acme"), api.tenant("other")
    job_id, pid = start_long_job(api, key, redis_server, namespace, suffix="never")
    jobs = "/v1/fine_tuning/jobs"
    file_id = api.call(key, "GET", "/v1/files").json()["data"][0]["id"]
    queued = api.call(key, "POST", jobs, json={**LONG, "training_file": file_id})
    assert queued.status_code == 200 and queued.json()["status"] == "queued"
    over = api.call(key, "POST", jobs, json={**LONG, "training_file": file_id})
    assert over.status_code == 429, over.text
    assert over.json()["error"]["code"] == "rate_limit_exceeded"
    # Scoping: the other tenant sees none of it, and cannot use acme's file.
    for method, path in (
        ("GET", f"{jobs}/{job_id}"),
        ("POST", f"{jobs}/{job_id}/cancel"),
        ("GET", f"{jobs}/{job_id}/events"),
        ("GET", f"{jobs}/{job_id}/checkpoints"),
    ):
        assert api.call(other, method, path).status_code == 404
    assert api.call(other, "GET", jobs).json()["data"] == []
    stolen = api.call(other, "POST", jobs, json={**LONG, "training_file": file_id})
    assert stolen.status_code == 404 and stolen.json()["error"]["param"] == "training_file"

    cancelled = api.call(key, "POST", f"{jobs}/{queued.json()['id']}/cancel").json()
    assert cancelled["status"] == "cancelled"
    reply = api.call(key, "POST", f"{jobs}/{job_id}/cancel")
    assert reply.status_code == 200 and reply.json()["status"] == "cancelled"
    assert wait_gone(pid), "the trainer process survived its cancel"
    time.sleep(1)  # a few dispatcher polls: nothing may change a cancelled job
    job = api.call(key, "GET", f"{jobs}/{job_id}").json()
    assert job["status"] == "cancelled" and job["fine_tuned_model"] is None
    assert job["finished_at"] is not None
    assert api.call(key, "GET", "/v1/adapters").json()["items"] == []
    assert not list((tmp_path / "objects").glob("finetune/*/*"))
    again = api.call(key, "POST", f"{jobs}/{job_id}/cancel")
    assert again.status_code == 200  # idempotent
    listed = api.call(key, "GET", f"{jobs}?limit=1").json()
    assert listed["has_more"] is True and listed["data"][0]["id"] == queued.json()["id"]
    older = api.call(key, "GET", f"{jobs}?limit=5&after={listed['data'][0]['id']}").json()
    assert [j["id"] for j in older["data"]] == [job_id]


def test_a_trainer_that_dies_fails_its_job_with_the_reason(
    api: Api, redis_server: str, namespace: str
) -> None:
    key = api.tenant("acme")
    job_id, pid = start_long_job(api, key, redis_server, namespace)
    os.killpg(pid, signal.SIGKILL)
    job = api.wait(key, job_id, lambda j: j["status"] != "running", timeout=30)
    assert job["status"] == "failed", job
    assert job["error"]["code"] == "training_failed"
    assert "killed by SIGKILL" in job["error"]["message"]
    assert api.call(key, "GET", "/v1/adapters").json()["items"] == []


def _registry_process(
    redis_url: str, namespace: str, model: Path, root: Path, port: int, heartbeat_s: float = 2
) -> Any:
    env = {
        "PREFT_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
        "PREFT_REGISTRY_REDIS_URL": redis_url,
        "PREFT_REGISTRY_NAMESPACE": namespace,
        "PREFT_REGISTRY_BASE_MODEL": str(model),
        "PREFT_REGISTRY_OBJECT_STORE__URL": str(root / "objects"),
        "PREFT_REGISTRY_STAGING_DIR": str(root),
        "PREFT_REGISTRY_PORT": str(port),
        "PREFT_REGISTRY_FINETUNE__HEARTBEAT_S": str(heartbeat_s),
        "PREFT_REGISTRY_FINETUNE__POLL_S": "0.2",
    }
    process = service(
        "registry",
        [sys.executable, "-m", "preft_serve.registry"],
        root,
        env,
        f"http://127.0.0.1:{port}",
    ).start()
    process.wait_http("/healthz", 90)
    return process


def test_registry_killed_mid_job_reports_it_failed_after_restart(
    redis_server: str, namespace: str, model_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    first = _registry_process(redis_server, namespace, model_dir, tmp_path, port)
    second = None
    try:
        api = Api(first.url)
        key = api.tenant("acme")
        job_id, pid = start_long_job(api, key, redis_server, namespace)
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"PREFT_REGISTRY_ADMIN_TOKEN" not in environ  # the trainer gets no secrets
        assert b"PREFT_TRAINER_SPEC" in environ
        first.kill()  # SIGKILL: no shutdown; the trainer has its own session and lives on
        assert alive(pid)
        second = _registry_process(redis_server, namespace, model_dir, tmp_path, port)
        job = api.wait(key, job_id, lambda j: j["status"] != "running", timeout=30)
        assert job["status"] == "failed" and job["error"]["code"] == "runner_lost", job
        assert (
            "the registry that ran this job stopped; its trainer process was stopped"
            in job["error"]["message"]
        )
        assert wait_gone(pid)
        events = api.call(key, "GET", f"/v1/fine_tuning/jobs/{job_id}/events").json()["data"]
        assert events[0]["level"] == "error" and "Job failed" in events[0]["message"]
    finally:
        first.stop()
        if second is not None:
            second.stop()


def _trainer_done_then_registry_killed(
    first: Any, api: Api, key: str, redis_url: str, namespace: str, root: Path, **job: Any
) -> tuple[str, Path]:
    """Start a short job on ``first``, pause that registry from the trainer's start (so it
    never sees the exit), wait for the trainer to store its whole output, then kill the
    registry; the job's id and the trainer's output folder."""
    file_id = api.upload(key, chat_jsonl()).json()["id"]
    job_id = _start_job(api, key, file_id, steps=20, **job)
    deadline = time.monotonic() + 60
    while "pid" not in (runner := record(redis_url, namespace, job_id).runner):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(first.proc.pid, signal.SIGSTOP)  # the trainer (own session) runs on
    output = root / "objects" / "finetune" / job_id
    assert wait_gone(runner["pid"], 120)
    assert sorted(p.name for p in output.iterdir()) == sorted(OUTPUT_FILES)
    first.kill()
    return job_id, output


def test_registry_killed_after_its_trainer_finished_registers_the_adapter_on_restart(
    redis_server: str, namespace: str, model_dir: Path, tmp_path: Path
) -> None:
    """The registry dies between the trainer's exit and the registration (it is paused from
    the trainer's start, so it never sees the exit): the next registry finds the whole
    output in the store and registers it; the job succeeds and nothing stays behind."""
    port = free_port()
    first = _registry_process(redis_server, namespace, model_dir, tmp_path, port)
    second = None
    try:
        api = Api(first.url)
        key = api.tenant("acme")
        job_id, output = _trainer_done_then_registry_killed(
            first, api, key, redis_server, namespace, tmp_path, suffix="survivor"
        )
        second = _registry_process(redis_server, namespace, model_dir, tmp_path, port)
        job = api.wait(key, job_id, lambda j: j["status"] != "running", timeout=60)
        assert job["status"] == "succeeded" and job["fine_tuned_model"] == "survivor", job
        versions = api.call(key, "GET", "/v1/adapters/survivor").json()["versions"]
        assert [v["version"] for v in versions] == [1]
        assert not output.exists() or not any(output.iterdir())
        events = api.call(key, "GET", f"/v1/fine_tuning/jobs/{job_id}/events").json()["data"]
        assert any("had finished before its registry stopped" in e["message"] for e in events), (
            events
        )
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_a_cancel_after_the_registry_died_mid_registration_leaves_no_output(
    redis_server: str, namespace: str, model_dir: Path, tmp_path: Path
) -> None:
    """The registry dies after its trainer stored the whole output, and the job is cancelled
    through the next registry before that one takes the job over (the dead one's heartbeat
    has not expired): the job is cancelled and the trainer's output is not left behind,
    outside every tenant's quota."""
    port = free_port()
    first = _registry_process(redis_server, namespace, model_dir, tmp_path, port, heartbeat_s=60)
    second = None
    try:
        api = Api(first.url)
        key = api.tenant("acme")
        job_id, output = _trainer_done_then_registry_killed(
            first, api, key, redis_server, namespace, tmp_path
        )
        second = _registry_process(
            redis_server, namespace, model_dir, tmp_path, port, heartbeat_s=60
        )
        reply = api.call(key, "POST", f"/v1/fine_tuning/jobs/{job_id}/cancel")
        assert reply.status_code == 200 and reply.json()["status"] == "cancelled", reply.text
        assert not output.exists() or not any(output.iterdir())
        assert api.call(key, "GET", "/v1/adapters").json()["items"] == []
    finally:
        first.stop()
        if second is not None:
            second.stop()


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "gpt-4o"}, 404, "model"),
        ({"suffix": "bad/name"}, 400, "suffix"),
        ({"suffix": "a..b"}, 400, "suffix"),  # refused by the registry at the end otherwise
        ({"hyperparameters": {"n_epochs": 0}}, 400, "hyperparameters"),
        ({"hyperparameters": {"n_epochs": 50, "batch_size": 1}}, 400, "hyperparameters"),
        ({"method": {"type": "preft", "preft": {"rank": 64}}}, 400, "method"),
        (
            {"method": {"type": "preft", "preft": {"adapter": "direft", "mode": "all"}}},
            400,
            "method",
        ),
        ({"validation_file": "file-" + "x" * 24}, 404, "validation_file"),
    ],
)
def test_bad_job_requests(
    serve: Callable[..., Api], body: dict[str, Any], status: int, param: str
) -> None:
    api = serve(max_steps=60)
    key = api.tenant("acme")
    file_id = api.upload(key, chat_jsonl()).json()["id"]
    reply = api.call(
        key,
        "POST",
        "/v1/fine_tuning/jobs",
        json={"model": "tiny-llama", "training_file": file_id, **body},
    )
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["param"] == param
    assert api.call(key, "GET", "/v1/fine_tuning/jobs").json()["data"] == []


@pytest.mark.parametrize(
    ("after", "status"),
    [
        ("ftevent-0-0", 200),  # before every event: an empty page
        ("ftevent-99999999999999999999-0", 400),  # past Redis's 64-bit ids
        ("ftevent-1-99999999999999999999", 400),
        ("ftevent-1-\u0661", 400),  # a non-ASCII digit
    ],
)
def test_event_cursors_the_tenant_mistyped_are_4xx_never_an_outage(
    serve: Callable[..., Api], after: str, status: int
) -> None:
    api = serve(max_steps=60)
    key = api.tenant("acme")
    file_id = api.upload(key, chat_jsonl()).json()["id"]
    job = api.call(
        key, "POST", "/v1/fine_tuning/jobs", json={"model": "tiny-llama", "training_file": file_id}
    ).json()
    api.call(key, "POST", f"/v1/fine_tuning/jobs/{job['id']}/cancel")
    reply = api.call(
        key, "GET", f"/v1/fine_tuning/jobs/{job['id']}/events", params={"after": after}
    )
    assert reply.status_code == status, reply.text
    if status == 200:
        assert reply.json()["data"] == [] and reply.json()["has_more"] is False
    else:
        assert reply.json()["error"]["param"] == "after"


def test_an_unknown_target_module_is_named_clipped(serve: Callable[..., Api]) -> None:
    api = serve(max_steps=60)
    key = api.tenant("acme")
    file_id = api.upload(key, chat_jsonl()).json()["id"]
    huge = "m" * 140_000
    reply = api.call(
        key,
        "POST",
        "/v1/fine_tuning/jobs",
        json={
            "model": "tiny-llama",
            "training_file": file_id,
            "method": {"type": "preft", "preft": {"target_modules": ["q_proj", huge]}},
        },
    )
    assert reply.status_code == 400, reply.text[:300]
    message = reply.json()["error"]["message"]
    assert "unknown 'mmmm" in message and "(140000 characters)" in message
    assert len(reply.content) < 2000


def test_a_cancel_that_loses_a_race_to_another_cancel_is_still_200(
    serve: Callable[..., Api], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two cancels of one job at once: the second finds it cancelled inside its own
    transaction (after its pre-check passed) and answers like a repeated cancel."""
    from preft_serve.registry.finetune.jobs import JobStore

    api = serve(max_steps=60)
    key = api.tenant("acme")
    file_id = api.upload(key, chat_jsonl()).json()["id"]
    job_id = api.call(
        key, "POST", "/v1/fine_tuning/jobs", json={"model": "tiny-llama", "training_file": file_id}
    ).json()["id"]
    real_update = JobStore.update
    raced: list[str] = []

    def update_after_a_rival(self: JobStore, job: str, change: Any, *args: Any) -> Any:
        if job == job_id and args[:1] == ("Job cancelled",) and not raced:
            raced.append(job)  # the rival cancel commits first

            def rival(r: JobRecord) -> JobRecord:
                r.job.status, r.job.finished_at = JobStatus.CANCELLED, int(time.time())
                return r

            real_update(self, job, rival, "Job cancelled")
        return real_update(self, job, change, *args)

    monkeypatch.setattr(JobStore, "update", update_after_a_rival)
    reply = api.call(key, "POST", f"/v1/fine_tuning/jobs/{job_id}/cancel")
    assert raced == [job_id]
    assert reply.status_code == 200, reply.text
    assert reply.json()["status"] == "cancelled"


def test_a_file_a_queued_job_reads_cannot_be_deleted_until_the_job_ends(
    serve: Callable[..., Api],
) -> None:
    api = serve(max_steps=60)
    key = api.tenant("acme")
    file_id = api.upload(key, chat_jsonl()).json()["id"]
    job_id = api.call(
        key, "POST", "/v1/fine_tuning/jobs", json={"model": "tiny-llama", "training_file": file_id}
    ).json()["id"]
    refused = api.call(key, "DELETE", f"/v1/files/{file_id}")
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "file_in_use" and job_id in error["message"]
    assert "files/" not in error["message"]  # no store key
    assert api.call(key, "GET", f"/v1/files/{file_id}").status_code == 200
    api.call(key, "POST", f"/v1/fine_tuning/jobs/{job_id}/cancel")
    assert api.call(key, "DELETE", f"/v1/files/{file_id}").status_code == 200


def test_a_job_that_fails_after_training_leaves_nothing_in_the_store(
    serve: Callable[..., Api], model_dir: Path, tmp_path: Path
) -> None:
    """The tenant is at its adapter quota, so the trained adapter is refused at
    registration: the job fails, and what its trainer stored (in no quota) is removed."""
    from preft_serve.toymodels import make_lora_adapter

    api = serve(registry={"tenant_max_adapters": 1}, max_steps=60)
    key = api.tenant("acme")
    adapter = make_lora_adapter(model_dir, tmp_path / "mine", seed=3)
    files = [
        ("files", (p.name, p.read_bytes(), "application/octet-stream"))
        for p in sorted(adapter.iterdir())
    ]
    assert (
        api.call(
            key, "POST", "/v1/adapters", data={"name": "mine", "mode": "prefill"}, files=files
        ).status_code
        == 201
    )
    file_id = api.upload(key, chat_jsonl()).json()["id"]
    job_id = _start_job(api, key, file_id, steps=2, suffix="second")
    job = api.wait(key, job_id, lambda j: j["status"] in ("failed", "succeeded"))
    assert job["status"] == "failed" and job["error"]["code"] == "invalid_adapter", job
    assert "quota" in job["error"]["message"]
    assert not list((tmp_path / "objects").rglob(f"finetune/{job_id}/*"))


def test_a_result_file_is_not_stored_past_the_tenants_file_limit(serve: Callable[..., Api]) -> None:
    api = serve(tenant_max_files=1, max_steps=60)
    key = api.tenant("acme")
    file_id = api.upload(key, chat_jsonl()).json()["id"]  # the tenant's one file
    job_id = _start_job(api, key, file_id, steps=2)
    job = api.wait(key, job_id, lambda j: j["status"] in ("failed", "succeeded"))
    assert job["status"] == "succeeded" and job["result_files"] == [], job
    assert [f["id"] for f in api.call(key, "GET", "/v1/files").json()["data"]] == [file_id]
    events = api.call(key, "GET", f"/v1/fine_tuning/jobs/{job_id}/events").json()["data"]
    assert any(
        "result file was not stored" in e["message"] and e["level"] == "warn" for e in events
    )
