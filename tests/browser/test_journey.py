"""A tenant's journey through the console in Chromium, each step checked against the
registry's or the gateway's own JSON answer: sign in, upload an adapter and a second
version, promote it and split traffic, bind a user, chat in the playground (streamed,
next to the base model), read the usage, delete the adapter, sign out."""

from __future__ import annotations

import time

import httpx
from playwright.sync_api import Page, expect

from preft_serve.adapters.format import AdapterMode
from preft_serve.toymodels import LoraSpec, make_lora_adapter
from tests.browser.console import go, shot, sign_in
from tests.e2e.stack import BASE_NAME, Base, Registry
from tests.support.processes import ServiceProcess

NAME = "journey-bot"
QUESTION = "Say something."
TOKENS = 16


def _get(url: str, key: str, path: str, **params: str) -> httpx.Response:
    return httpx.get(
        f"{url}{path}", params=params, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def _usage_requests(registry: Registry, key: str) -> int:
    report = _get(registry.url, key, "/v1/usage", group_by="day", by="model").json()
    return sum(
        item["requests"]
        for bucket in report["buckets"]
        for item in bucket["items"]
        if item["name"] == NAME
    )


def test_tenant_journey(
    page: Page, gateway: ServiceProcess, registry: Registry, base: Base
) -> None:
    key = registry.create_tenant("journey")
    # A wrong key: refused with the gateway's message, and still on the sign-in form.
    page.goto(f"{gateway.url}/console/")
    page.get_by_label("API key").fill("sk-not-a-key")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("API key")
    expect(page.get_by_role("navigation")).to_be_hidden()
    shot(page, "sign-in")

    sign_in(page, gateway.url, key)
    expect(page.get_by_text("No adapters yet.")).to_be_visible()

    # Upload version 1 from the adapter's files, then a second version, staged.
    first = make_lora_adapter(base.model, base.root / "journey-v1", seed=51)
    second = make_lora_adapter(
        base.model, base.root / "journey-v2", seed=52, spec=LoraSpec(rank=8, mode=AdapterMode.ALL)
    )
    go(page, "Upload", "Upload an adapter")
    page.get_by_label("Adapter name").fill(NAME)
    page.get_by_label("Files", exact=True).set_input_files(sorted(first.iterdir()))
    expect(page.get_by_text("adapter_config.json (")).to_be_visible()
    shot(page, "upload")
    page.get_by_role("button", name="Upload").click()
    expect(page.get_by_role("status")).to_contain_text(f"Stored {NAME} version 1")
    stored = _get(registry.url, key, f"/v1/adapters/{NAME}").json()
    assert stored["version"] == 1
    page.get_by_label("Add a version to an existing adapter").check()
    page.get_by_label("Files", exact=True).set_input_files(sorted(second.iterdir()))
    page.get_by_role("button", name="Upload").click()
    expect(page.get_by_role("status")).to_contain_text(f"Stored {NAME} version 2")
    policy = _get(registry.url, key, f"/v1/adapters/{NAME}/policy").json()
    assert policy["version"] == 1
    assert [v["state"] for v in policy["versions"]] == ["serving", "staged"]

    # The detail page shows the registry's versions; promote 2, then split to 1.
    page.get_by_role("link", name=f"Open {NAME}").click()
    rows = page.locator("table").first.locator("tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("staged")
    expect(rows.nth(0)).to_contain_text(policy["versions"][1]["sha256"][:12])
    page.get_by_role("button", name="Promote version 2").click()
    expect(page.get_by_role("status")).to_contain_text("Serving version 2: done.")
    assert _get(registry.url, key, f"/v1/adapters/{NAME}/policy").json()["version"] == 2
    page.get_by_label("Share of users (0–1)").fill("0.25")
    page.get_by_role("button", name="Set split").click()
    expect(page.get_by_role("status")).to_contain_text("Setting the split: done.")
    canary = _get(registry.url, key, f"/v1/adapters/{NAME}/policy").json()["canary"]
    assert (canary["version"], canary["weight"]) == (1, 0.25)
    expect(page.get_by_text("version 1 to 25% of users")).to_be_visible()
    shot(page, "adapter")
    page.get_by_role("button", name="Remove split").click()
    expect(page.get_by_role("status")).to_contain_text("Removing the split: done.")
    assert _get(registry.url, key, f"/v1/adapters/{NAME}/policy").json()["canary"] is None

    # Bind a user; the registry has the binding and the page lists it.
    go(page, "Users", "Users")
    page.get_by_label("User id").fill("alice")
    page.get_by_label("Adapter", exact=True).fill(NAME)
    page.get_by_role("button", name="Bind").click()
    expect(page.get_by_role("status")).to_contain_text(f"Bound alice to {NAME} (version 2)")
    assert _get(registry.url, key, "/v1/users/alice").json()["adapter"] == NAME
    expect(page.get_by_role("row", name=f"alice {NAME}")).to_be_visible()
    shot(page, "users")

    # Chat: the streamed answers are the gateway's own greedy answers, and the headers
    # name the adapter (and "none" for the base model).
    go(page, "Playground", "Playground")
    expect(page.get_by_role("combobox", name="Adapter")).to_contain_text(NAME)
    page.get_by_role("combobox", name="Adapter").select_option(NAME)
    page.get_by_label("Max tokens").fill(str(TOKENS))
    page.get_by_label("Message").fill(QUESTION)
    # A random toy model soon samples its end token: let it run to max_tokens.
    page.get_by_label("More parameters (JSON object)").fill('{"ignore_eos": true}')
    page.get_by_role("button", name="Send").click()
    adapter_pane = page.get_by_role("region", name="With the adapter")
    base_pane = page.get_by_role("region", name=f"Base model ({BASE_NAME})")
    for pane in (adapter_pane, base_pane):
        expect(pane.locator(".stream-done")).to_contain_text("completion tokens", timeout=120_000)
    expect(adapter_pane.locator("dd").first).to_have_text(NAME)
    expect(base_pane.locator("dd").first).to_have_text("none")
    shot(page, "playground")
    for pane, model in ((adapter_pane, NAME), (base_pane, BASE_NAME)):
        reference = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": QUESTION}],
                "max_tokens": TOKENS,
                "temperature": 0,
                "ignore_eos": True,
            },
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        )
        assert reference.status_code == 200, reference.text
        text = reference.json()["choices"][0]["message"]["content"]
        assert text, "the reference answer is empty: nothing to compare"
        assert pane.locator(".answer").text_content() == text

    # As a user: the base model's name with the user runs the user's binding.
    facts = adapter_pane.locator("dd")  # adapter, version, sha256, request id, stream
    before = facts.nth(3).text_content() or ""
    page.get_by_label("or as user (their binding)").fill("alice")
    page.get_by_role("button", name="Send").click()
    expect(facts.nth(3)).not_to_have_text(before, timeout=120_000)
    expect(adapter_pane.locator(".stream-done")).to_contain_text("completion tokens")
    expect(facts.nth(0)).to_have_text(NAME)
    expect(facts.nth(1)).to_have_text("2")

    # Usage: the page's count for the adapter is the registry's.
    deadline = time.monotonic() + 30
    while _usage_requests(registry, key) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    counted = _usage_requests(registry, key)
    assert counted >= 3
    go(page, "Usage", "Usage")
    row = page.get_by_role("row").filter(has_text=NAME)
    expect(row.locator("td").nth(2)).to_have_text(str(counted))
    expect(page.get_by_role("img", name="Requests per bucket")).to_be_visible()
    with page.expect_download() as download:
        page.get_by_role("button", name="Export CSV").click()
    csv = download.value.path().read_text()
    assert f",{NAME},{counted}," in csv
    shot(page, "usage")

    # Keys and audit: the registry's own entries.
    go(page, "Keys", "API keys")
    keys = _get(registry.url, key, "/v1/keys").json()
    expect(page.get_by_role("row").filter(has_text=keys[0]["key_id"])).to_be_visible()
    shot(page, "keys")
    go(page, "Audit log", "Audit log")
    entries = _get(registry.url, key, "/v1/audit").json()["data"]
    expect(page.locator("tbody tr")).to_have_count(len(entries))
    shot(page, "audit")

    # Delete, confirmed in a dialog (cancel first: nothing happens).
    page.goto(f"{gateway.url}/console/#/adapters/{NAME}")
    page.get_by_role("button", name="Delete adapter").click()
    page.get_by_role("dialog").get_by_role("button", name="Cancel").click()
    assert _get(registry.url, key, f"/v1/adapters/{NAME}").status_code == 200
    page.get_by_role("button", name="Delete adapter").click()
    page.get_by_role("dialog").get_by_role("button", name="Delete").click()
    expect(page.get_by_text("No adapters yet.")).to_be_visible()
    assert _get(registry.url, key, f"/v1/adapters/{NAME}").status_code == 404

    # Sign out: the key is nowhere in the browser.
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_label("API key")).to_be_visible()
    stored_anywhere = page.evaluate(
        "() => [document.cookie, JSON.stringify(localStorage), JSON.stringify(sessionStorage)]"
    )
    assert all(key not in value for value in stored_anywhere)
    assert page.context.cookies() == []
