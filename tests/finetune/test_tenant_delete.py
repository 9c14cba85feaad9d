"""Deleting a tenant takes its fine-tuning files and jobs with it: refused while a job is
queued or running (it would register an adapter for a tenant that is gone), then every
file and job record goes, and a file's content unless another tenant's file shares it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import redis

from tests.finetune.conftest import Api, chat_jsonl
from tests.support.registry_api import ADMIN_TOKEN

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
LONG = {"model": "tiny-llama", "method": {"type": "preft", "preft": {"steps": 5000}}}


def test_tenant_delete_takes_files_and_jobs(
    serve: Callable[..., Api], redis_server: str, namespace: str, tmp_path: Path
) -> None:
    api = serve()
    acme, globex = api.tenant("acme"), api.tenant("globex")
    shared = api.upload(acme, chat_jsonl()).json()
    only_acme = api.upload(acme, chat_jsonl({"who": "acme alone"})).json()
    theirs = api.upload(globex, chat_jsonl()).json()  # same content as `shared`
    job = api.call(
        acme, "POST", "/v1/fine_tuning/jobs", json={**LONG, "training_file": shared["id"]}
    ).json()
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    before = sorted(client.scan_iter(match=f"{namespace}:*"))

    refused = httpx.delete(f"{api.url}/v1/tenants/acme", headers=ADMIN, timeout=30)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "jobs_active"
    assert job["id"] in refused.json()["error"]["message"]
    assert api.call(acme, "GET", f"/v1/files/{only_acme['id']}").status_code == 200
    # Nothing of the tenant was removed (the dispatcher may have moved the job along).
    assert set(before) - set(client.scan_iter(match=f"{namespace}:*")) <= {
        f"{namespace}:ftjob:{job['id']}:events"
    }

    api.call(acme, "POST", f"/v1/fine_tuning/jobs/{job['id']}/cancel")
    api.wait(acme, job["id"], lambda j: j["status"] == "cancelled")
    deleted = httpx.delete(f"{api.url}/v1/tenants/acme", headers=ADMIN, timeout=30)
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["files"] == 2 and deleted.json()["fine_tuning_jobs"] == 1

    left = set(client.scan_iter(match=f"{namespace}:*"))
    assert not any(job["id"] in k or shared["id"] in k or only_acme["id"] in k for k in left)
    objects = tmp_path / "objects"
    blobs = {p.name for p in objects.rglob("*.jsonl")}
    assert len(blobs) == 1  # the shared content stays for globex; acme's own is gone
    content = api.call(globex, "GET", f"/v1/files/{theirs['id']}/content")
    assert content.status_code == 200 and content.content == chat_jsonl()
    client.close()
