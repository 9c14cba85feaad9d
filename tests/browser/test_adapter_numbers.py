"""The adapter page's numbers per version and the playground's Responses switch, in
Chromium against the real stack. Requests are served to both sides of a canary split; what
each version should show is counted here from the answers (``x-preft-adapter-version``,
the answer's usage, the status). The streamed Responses answer in the playground must equal
the gateway's own non-streamed greedy answer for the same input."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import httpx
from playwright.sync_api import Page, expect

from preft_serve.adapters.format import AdapterMode
from preft_serve.toymodels import LoraSpec, make_lora_adapter
from tests.browser.console import go, sign_in
from tests.e2e.stack import BASE_NAME, Base, Registry
from tests.support.canary_split import in_canary
from tests.support.processes import ServiceProcess

NAME = "numbers-bot"
WEIGHT = 0.5
USERS = [f"user-{i}" for i in range(12)]
QUESTION = "Say something."
TOKENS = 8


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _version_requests(registry: Registry, key: str) -> Counter[str]:
    report = httpx.get(
        f"{registry.url}/v1/usage", params={"by": "version"}, headers=_auth(key), timeout=30
    ).json()
    found: Counter[str] = Counter()
    for bucket in report["buckets"]:
        for item in bucket["items"]:
            found[item["name"]] += item["requests"] + item["errors"]
    return found


def test_the_adapter_page_shows_each_versions_numbers(
    page: Page, gateway: ServiceProcess, registry: Registry, base: Base
) -> None:
    key = registry.create_tenant("numbers")
    first = make_lora_adapter(base.model, base.root / "numbers-v1", seed=61)
    second = make_lora_adapter(
        base.model, base.root / "numbers-v2", seed=62, spec=LoraSpec(rank=8, mode=AdapterMode.ALL)
    )
    registry.upload(key, NAME, first, "prefill")
    registry.upload(key, NAME, second, "all", new_version=True)  # promoted: 2 serves
    policy = {"version": 2, "canary": {"version": 1, "weight": WEIGHT}}
    set_policy = httpx.put(
        f"{registry.url}/v1/adapters/{NAME}/policy", json=policy, headers=_auth(key), timeout=30
    )
    assert set_policy.status_code == 200, set_policy.text
    canary = [u for u in USERS if in_canary(NAME, u, WEIGHT)]
    assert 2 <= len(canary) <= len(USERS) - 2  # both sides are served

    expected: dict[int, Counter[str]] = {1: Counter(), 2: Counter()}
    streamed = 0
    for i, user in enumerate(USERS):
        stream = i % 3 == 0
        body: dict[str, Any] = {
            "model": NAME,
            "user": user,
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": 2 + i % 4,
            "temperature": 0,
            "ignore_eos": True,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        answer = httpx.post(
            f"{gateway.url}/v1/chat/completions", json=body, headers=_auth(key), timeout=120
        )
        assert answer.status_code == 200, answer.text
        version = int(answer.headers["x-preft-adapter-version"])
        assert version == (1 if user in canary else 2)  # the split, restated
        if stream:
            usage = next(
                chunk["usage"]
                for line in reversed(answer.text.splitlines())
                if line.startswith("data: {")
                for chunk in [json.loads(line[6:])]
                if chunk.get("usage")
            )
            expected[version]["streamed"] += 1
            streamed += 1
        else:
            usage = answer.json()["usage"]
        expected[version]["requests"] += 1
        expected[version]["prompt"] += usage["prompt_tokens"]
        expected[version]["completion"] += usage["completion_tokens"]
    # Failed by the worker after the version was chosen (vLLM refuses min_tokens above
    # max_tokens), pinned to version 1; the answer names the version.
    failed = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={
            "model": f"{NAME}@1",
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": 2,
            "min_tokens": 4,
        },
        headers=_auth(key),
        timeout=120,
    )
    assert failed.status_code == 400, failed.text
    assert failed.headers.get("x-preft-adapter-version") == "1", failed.headers
    expected[1]["errors"] += 1

    total = {f"{NAME}@{v}": c["requests"] + c["errors"] for v, c in expected.items()}
    deadline = time.monotonic() + 30  # the gateway writes its counts once a second
    while _version_requests(registry, key) != total:
        assert time.monotonic() < deadline, (_version_requests(registry, key), total)
        time.sleep(0.5)

    sign_in(page, gateway.url, key)
    page.goto(f"{gateway.url}/console/#/adapters/{NAME}")
    expect(page.get_by_role("heading", name="Usage per version")).to_be_visible()
    table = page.get_by_role("table").filter(
        has=page.get_by_role("columnheader", name="Mean time to first token")
    )
    for version, counts in expected.items():
        row = table.get_by_role("row").filter(has_text=f"v{version}")
        cells = row.locator("td")
        expect(cells.nth(0)).to_have_text(f"v{version}")
        expect(cells.nth(1)).to_have_text(str(counts["requests"]))
        expect(cells.nth(2)).to_have_text(str(counts["prompt"]))
        expect(cells.nth(3)).to_have_text(str(counts["completion"]))
        expect(cells.nth(4)).to_have_text(str(counts["errors"]))
        if counts["streamed"]:
            expect(cells.nth(5)).to_contain_text(f"({counts['streamed']} streamed)")
            assert int((cells.nth(5).text_content() or "").split(" ms")[0]) >= 0
        else:
            expect(cells.nth(5)).to_have_text("–")
    assert streamed >= 2
    # Another window asks again: the last 24 hours hold the same requests.
    page.get_by_label("Window").select_option("24h")
    expect(table.get_by_role("row").filter(has_text="v2").locator("td").nth(1)).to_have_text(
        str(expected[2]["requests"])
    )


def test_the_playground_streams_the_responses_api(
    page: Page, gateway: ServiceProcess, registry: Registry, base: Base
) -> None:
    key = registry.create_tenant("responses-play")
    adapter = make_lora_adapter(base.model, base.root / "play-resp", seed=63)
    registry.upload(key, "resp-play", adapter, "prefill")
    sign_in(page, gateway.url, key)
    go(page, "Playground", "Playground")
    expect(page.get_by_role("combobox", name="Adapter")).to_contain_text("resp-play")
    page.get_by_role("combobox", name="Adapter").select_option("resp-play")
    page.get_by_label("Responses").check()
    page.get_by_label("Max tokens").fill(str(TOKENS))
    page.get_by_label("Message").fill(QUESTION)
    page.get_by_role("button", name="Send").click()
    adapter_pane = page.get_by_role("region", name="With the adapter")
    base_pane = page.get_by_role("region", name=f"Base model ({BASE_NAME})")
    for pane in (adapter_pane, base_pane):
        expect(pane.locator(".stream-done")).to_contain_text("output tokens", timeout=120_000)
    expect(adapter_pane.locator("dd").first).to_have_text("resp-play")
    expect(adapter_pane.locator("dd").nth(1)).to_have_text("1")
    expect(base_pane.locator("dd").first).to_have_text("none")
    texts = []
    for pane, model in ((adapter_pane, "resp-play"), (base_pane, BASE_NAME)):
        reference = httpx.post(
            f"{gateway.url}/v1/responses",
            json={
                "model": model,
                "input": QUESTION,
                "max_output_tokens": TOKENS,
                "temperature": 0,
            },
            headers=_auth(key),
            timeout=120,
        )
        assert reference.status_code == 200, reference.text
        text = "".join(
            part["text"]
            for item in reference.json()["output"]
            if item.get("type") == "message"
            for part in item["content"]
            if part.get("type") == "output_text"
        )
        assert pane.locator(".answer").text_content() == text
        assert (
            pane.locator(".stream-done")
            .text_content()
            .endswith(f"{reference.json()['usage']['output_tokens']} output tokens")
        )
        texts.append(text)
    assert any(texts), "both reference answers are empty: nothing to compare"
