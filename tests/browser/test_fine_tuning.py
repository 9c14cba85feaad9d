"""Fine-tuning in the console: a bad training file is refused with the registry's words
and nothing stored; a good one trains an adapter while the page's loss chart gains a point
per metrics event; the result names the trained adapter and its checkpoint; a second job
is cancelled from the page."""

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

    # The registry fine-tunes the base model under its own label.
    page.get_by_label("Base model").fill(base.model.name)
    page.get_by_label("Adapter name (suffix)").fill(SUFFIX)
    page.get_by_label("Steps").fill("40")  # long enough to be seen running with points
    page.get_by_role("button", name="Create job").click()
    expect(page.get_by_role("heading", name="Job ftjob-")).to_be_visible()
    job_id = page.url.rsplit("/", 1)[-1]
    # The chart moves while the job runs: it has points before the job has finished.
    chart = page.locator(".loss")
    seen: list[tuple[str | None, str | None]] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        seen.append(
            (chart.get_attribute("data-points"), page.locator(".job-status").text_content())
        )
        if seen[-1][1] == "Status: succeeded":
            break
        time.sleep(0.1)
    assert seen[-1][1] == "Status: succeeded", seen[-1]
    running = {
        int(points)
        for points, status in seen
        if points and (status or "").startswith("Status: running")
    }
    assert running - {0}, f"no loss point was drawn while the job ran: {sorted(set(seen))}"
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

    # A second job, cancelled from its page after the confirmation.
    go(page, "Fine-tuning", "Fine-tuning")
    page.get_by_label("Base model").fill(base.model.name)
    page.get_by_label("Adapter name (suffix)").fill("ft-cancelled")
    page.get_by_label("Steps").fill("400")
    page.get_by_role("button", name="Create job").click()
    expect(page.get_by_role("button", name="Cancel job")).to_be_enabled()
    page.get_by_role("button", name="Cancel job").click()
    page.get_by_role("dialog").get_by_role("button", name="Cancel job").click()
    expect(page.locator(".job-status")).to_have_text("Status: cancelled", timeout=60_000)
    second = page.url.rsplit("/", 1)[-1]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = _api(gateway.url, key, "GET", f"/v1/fine_tuning/jobs/{second}").json()["status"]
        if status == "cancelled":
            break
        time.sleep(0.5)
    assert status == "cancelled"
