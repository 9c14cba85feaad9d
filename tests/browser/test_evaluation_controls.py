"""The evaluation gate's controls on the adapter page, in Chromium against the real stack:
attach an evaluation file, see the gate hold a staged version back (the registry's refusal
next to its Promote button), run the evaluation and read the scores the registry stored,
promote, force a promote past the gate behind the confirmation dialog, refuse a bad file
with the registry's own words and store nothing, remove the evaluation.

The expected answers are the staged version's own greedy answers, asked of the gateway
here (not through the console); the serving version's score is counted from its greedy
answers the same way, so both scores the page shows are known before the run."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from playwright.sync_api import FilePayload, Page, expect

from tests.browser.console import sign_in, upload_versions
from tests.e2e.stack import Base, Registry
from tests.support.processes import ServiceProcess

NAME = "gate-bot"
PROMPTS = ["Say something.", "Name a colour.", "Count to three.", "Greet me."]
TOKENS = 6
MARGIN = 0.05


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _greedy(gateway: ServiceProcess, key: str, model: str, prompt: str) -> str:
    """The answer the evaluation asks for: greedy, ``max_tokens`` of the evaluation."""
    reply = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": TOKENS,
            "temperature": 0,
        },
        headers=_auth(key),
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"] or "")


def _jsonl(lines: list[list[dict[str, str]]]) -> bytes:
    return "".join(json.dumps({"messages": m}) + "\n" for m in lines).encode()


def _shown(result: dict[str, Any]) -> str:
    """The page's words for a stored result, restated (exact: shares as percentages)."""
    verdict = "passed" if result["passed"] else "failed"
    return (
        f"{verdict}: exact {float(result['score']) * 100:.1f}% vs v{result['serving_version']} "
        f"{float(result['serving_score']) * 100:.1f}% on {result['examples']} examples"
    )


def test_the_evaluation_gate_from_the_adapter_page(
    page: Page, gateway: ServiceProcess, registry: Registry, base: Base
) -> None:
    key = registry.create_tenant("gate")
    api = httpx.Client(base_url=gateway.url, headers=_auth(key), timeout=60)
    upload_versions(registry, base, key, NAME, "gate", (71, 72))

    answers = {v: [_greedy(gateway, key, f"{NAME}@{v}", p) for p in PROMPTS] for v in (1, 2)}
    expected = answers[2]
    serving_right = sum(a.strip() == e.strip() for a, e in zip(answers[1], expected, strict=True))
    assert serving_right < len(PROMPTS), "both versions answer alike: nothing to tell apart"
    good = _jsonl(
        [
            [{"role": "user", "content": p}, {"role": "assistant", "content": e}]
            for p, e in zip(PROMPTS, expected, strict=True)
        ]
    )
    # Valid for training (it has an answer) but not for evaluation: it ends with the user.
    bad = _jsonl(
        [
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
            [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "And?"},
            ],
        ]
    )

    sign_in(page, gateway.url, key)
    page.goto(f"{gateway.url}/console/#/adapters/{NAME}")
    expect(page.locator("#evaluation-none")).to_be_visible()

    # Attach: the registry's config is what the form sent, and the page shows it.
    form = page.get_by_role("form", name="Attach an evaluation")
    form.get_by_label("Evaluation file").set_input_files(
        FilePayload(name="gate-eval.jsonl", mimeType="application/jsonl", buffer=good)
    )
    form.get_by_label("Metric").select_option("exact")
    form.get_by_label("Margin").fill(str(MARGIN))
    form.get_by_label("Max tokens per answer").fill(str(TOKENS))
    form.get_by_role("button", name="Attach evaluation").click()
    expect(page.get_by_role("status")).to_have_text(
        f"Attached gate-eval.jsonl ({len(PROMPTS)} examples, exact) as the evaluation."
    )
    config = api.get(f"/v1/adapters/{NAME}/evaluation").json()
    assert (config["metric"], config["margin"], config["max_tokens"], config["examples"]) == (
        "exact",
        MARGIN,
        TOKENS,
        len(PROMPTS),
    )
    expect(page.locator("#evaluation-config dd").first).to_have_text(config["file_id"])

    # The gate holds version 2 back: the registry's refusal, next to the button.
    reference = httpx.post(
        f"{registry.url}/v1/adapters/{NAME}/versions/2/promote", headers=_auth(key), timeout=30
    )
    assert reference.status_code == 409, reference.text
    assert reference.json()["error"]["code"] == "evaluation_required"
    page.get_by_role("button", name="Promote version 2", exact=True).click()
    expect(page.locator("#promote-refusal-2")).to_have_text(reference.json()["error"]["message"])
    expect(page.get_by_role("button", name="Force promote of version 2")).to_be_visible()
    assert api.get(f"/v1/adapters/{NAME}/policy").json()["version"] == 1

    # Run it (the newest staged version by default): the stored scores are the counted ones.
    page.get_by_role("button", name="Run evaluation").click()
    outcome = page.locator("#evaluation-run-result")
    expect(outcome).to_be_visible(timeout=60_000)
    stored = {
        v["version"]: v["evaluation"]
        for v in api.get(f"/v1/adapters/{NAME}/policy").json()["versions"]
    }
    result = stored[2]
    assert result["score"] == 1.0  # its own greedy answers
    assert result["serving_version"] == 1
    assert result["serving_score"] == serving_right / len(PROMPTS)
    assert result["passed"] is (result["score"] >= result["serving_score"] - MARGIN)
    expect(outcome).to_have_text(f"v2: {_shown(result)}")
    row = page.locator("table").first.get_by_role("row").filter(has_text="v2")
    expect(row.locator("td").nth(6)).to_have_text(_shown(result))

    # Passed: the promote goes through now.
    page.get_by_role("button", name="Promote version 2", exact=True).click()
    expect(page.get_by_role("status")).to_have_text("Serving version 2: done.")
    assert api.get(f"/v1/adapters/{NAME}/policy").json()["version"] == 2

    # A version without a result: refused, then forced behind the dialog (cancel first).
    upload_versions(registry, base, key, NAME, "gate", (73,), first_version=3)
    # Redraw the page (a reload would sign out: the key lives in the page's memory).
    page.evaluate("location.hash = '#/adapters'")
    expect(page.get_by_role("heading", name="Adapters", exact=True)).to_be_visible()
    page.evaluate(f"location.hash = '#/adapters/{NAME}'")
    page.get_by_role("button", name="Promote version 3", exact=True).click()
    expect(page.locator("#promote-refusal-3")).to_contain_text("has no evaluation result")
    page.get_by_role("button", name="Force promote of version 3").click()
    page.get_by_role("dialog").get_by_role("button", name="Cancel").click()
    assert api.get(f"/v1/adapters/{NAME}/policy").json()["version"] == 2
    page.get_by_role("button", name="Force promote of version 3").click()
    page.get_by_role("dialog").get_by_role("button", name="Promote anyway").click()
    expect(page.get_by_role("status")).to_have_text("Serving version 3 (gate skipped): done.")
    assert api.get(f"/v1/adapters/{NAME}/policy").json()["version"] == 3
    audit = api.get("/v1/audit").json()["data"]
    assert any("evaluation gate skipped: force" in str(entry.get("after")) for entry in audit)

    # A bad file: the registry's words (for the file the page uploaded), nothing stored.
    ref_file = api.post(
        "/v1/files",
        data={"purpose": "fine-tune"},
        files={"file": ("bad.jsonl", bad, "application/jsonl")},
    )
    assert ref_file.status_code in (200, 201), ref_file.text
    ref_id = ref_file.json()["id"]
    refused = api.put(
        f"/v1/adapters/{NAME}/evaluation",
        json={"file_id": ref_id, "metric": "exact", "margin": MARGIN, "max_tokens": TOKENS},
    )
    assert refused.status_code == 400, refused.text
    api.delete(f"/v1/files/{ref_id}")
    form.get_by_label("Evaluation file").set_input_files(
        FilePayload(name="bad.jsonl", mimeType="application/jsonl", buffer=bad)
    )
    form.get_by_role("button", name="Attach evaluation").click()
    error = page.locator("#evaluation-file-error")
    expect(error).to_contain_text("cannot be an evaluation file")
    shown_id = re.search(r"file (\S+) cannot be an evaluation file", error.text_content() or "")
    assert shown_id is not None
    expect(error).to_have_text(refused.json()["error"]["message"].replace(ref_id, shown_id[1]))
    assert api.get(f"/v1/adapters/{NAME}/evaluation").json() == config  # the previous one
    left = api.get(f"/v1/files/{shown_id[1]}")
    for _ in range(20):  # the page deletes the refused file as it shows the error
        if left.status_code == 404:
            break
        page.wait_for_timeout(100)
        left = api.get(f"/v1/files/{shown_id[1]}")
    assert left.status_code == 404, left.text

    # Remove it, confirmed: promotes need no result again.
    page.get_by_role("button", name="Remove evaluation").click()
    page.get_by_role("dialog").get_by_role("button", name="Remove").click()
    expect(page.locator("#evaluation-none")).to_be_visible()
    assert api.get(f"/v1/adapters/{NAME}/evaluation").status_code == 404
    api.close()
