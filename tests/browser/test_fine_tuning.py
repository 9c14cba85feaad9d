"""Fine-tuning in the console: a bad training file is refused with the registry's words
and nothing stored; a long job's loss chart gains points while it runs, and the job is
cancelled from its page; a short job's chart has a point per metrics event, and its result
names the trained adapter and its checkpoint."""

from __future__ import annotations

import time
from typing import Any

import httpx
from playwright.sync_api import Page, expect

from tests.browser.console import go, shot, sign_in
from tests.e2e.stack import Base, Registry
from tests.finetune.conftest import chat_jsonl
from tests.support.processes import ServiceProcess

SUFFIX = "ft-bot"
BAD = b'{"messages": [{"role": "user", "content": "hi"}]}\nnot json\n'


def _api(gateway: str, key: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(
        method, f"{gateway}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=30, **kwargs
    )


def _upload_file(page: Page, name: str, content: bytes) -> None:
    page.get_by_label("Training file (JSONL)").set_input_files(
        {"name": name, "mimeType": "application/jsonl", "buffer": content}
    )
    page.get_by_role("button", name="Upload file").click()


def test_train_watch_and_cancel(
    page: Page, gateway: ServiceProcess, registry: Registry, base: Base
) -> None:
    key = registry.create_tenant("tuning")
    sign_in(page, gateway.url, key)
    go(page, "Fine-tuning", "Fine-tuning")

    _upload_file(page, "bad.jsonl", BAD)
    reference = _api(
        gateway.url,
        key,
        "POST",
        "/v1/files",
        data={"purpose": "fine-tune"},
        files={"file": ("bad.jsonl", BAD, "application/jsonl")},
    )
    assert reference.status_code == 400
    message = reference.json()["error"]["message"]
    assert "line 2" in message  # the registry names the bad line
    expect(page.locator("#training-file-error")).to_have_text(message)
    assert _api(gateway.url, key, "GET", "/v1/files").json()["data"] == []

    _upload_file(page, "train.jsonl", chat_jsonl())
    expect(page.get_by_role("status")).to_contain_text("Stored train.jsonl as file-")
    stored = _api(gateway.url, key, "GET", "/v1/files").json()["data"]
    assert [f["filename"] for f in stored] == ["train.jsonl"]
    expect(page.get_by_role("combobox", name="Training file")).to_have_value(stored[0]["id"])

    # A long job: the chart gains points while it runs (whatever the machine's speed: the
    # job runs until it is cancelled); then it is cancelled from its page.
    _create_job(page, base, "ft-watched", steps=400)
    watched = page.url.rsplit("/", 1)[-1]
    chart = page.locator(".loss")
    seen: list[tuple[str | None, str | None]] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        seen.append(
            (chart.get_attribute("data-points"), page.locator(".job-status").text_content())
        )
        points, status = seen[-1]
        if points and int(points) >= 2 and (status or "").startswith("Status: running"):
            break
        time.sleep(0.1)
    assert int(seen[-1][0] or 0) >= 2, f"no loss points while the job ran: {sorted(set(seen))}"
    drawn = _api(
        gateway.url, key, "GET", f"/v1/fine_tuning/jobs/{watched}/events", params={"limit": 100}
    ).json()["data"]
    assert int(seen[-1][0] or 0) <= sum(e["type"] == "metrics" for e in drawn)
    page.get_by_role("button", name="Cancel job").click()
    page.get_by_role("dialog").get_by_role("button", name="Cancel job").click()
    expect(page.locator(".job-status")).to_have_text("Status: cancelled", timeout=60_000)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = _api(gateway.url, key, "GET", f"/v1/fine_tuning/jobs/{watched}").json()["status"]
        if status == "cancelled":
            break
        time.sleep(0.5)
    assert status == "cancelled"

    # A short job to its end: one chart point per metrics event, the trained adapter and
    # its checkpoint.
    go(page, "Fine-tuning", "Fine-tuning")
    _create_job(page, base, SUFFIX, steps=12)
    job_id = page.url.rsplit("/", 1)[-1]
    expect(page.locator(".job-status")).to_have_text("Status: succeeded", timeout=240_000)
    job = _api(gateway.url, key, "GET", f"/v1/fine_tuning/jobs/{job_id}").json()
    events = _api(
        gateway.url, key, "GET", f"/v1/fine_tuning/jobs/{job_id}/events", params={"limit": 100}
    ).json()["data"]
    metrics = [e for e in events if e["type"] == "metrics"]
    assert len(metrics) >= 2
    expect(chart).to_have_attribute("data-points", str(len(metrics)))
    expect(page.get_by_role("img", name="Training loss by step")).to_be_visible()
    assert job["fine_tuned_model"] == SUFFIX
    expect(page.get_by_role("link", name=SUFFIX)).to_be_visible()
    checkpoints = _api(gateway.url, key, "GET", f"/v1/fine_tuning/jobs/{job_id}/checkpoints")
    name = checkpoints.json()["data"][0]["fine_tuned_model_checkpoint"]
    expect(page.get_by_role("cell", name=name)).to_be_visible()
    shot(page, "fine-tuning")


def _create_job(page: Page, base: Base, suffix: str, steps: int) -> None:
    """A job on the stored training file, from the fine-tuning page; its page opens."""
    page.get_by_label("Base model").fill(base.model.name)  # the registry's label for it
    page.get_by_label("Adapter name (suffix)").fill(suffix)
    page.get_by_label("Steps").fill(str(steps))
    page.get_by_role("button", name="Create job").click()
    # The page opens once the registry has taken the job (it reads the training file back
    # from the store): seconds on a machine busy with other suites, past expect's 5 s.
    expect(page.get_by_role("heading", name="Job ftjob-")).to_be_visible(timeout=60_000)
