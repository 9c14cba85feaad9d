"""The adapter page against a world that moved on, in Chromium against the real stack: a
split set after another client promoted a version sends nothing (the policy PUT names the
serving version, and the registry would serve the one it names again), a split another
client sets after the page loaded is refused by the registry (If-Match)
rather than overwritten, and an evaluation
attach that fails without a refusal (a 503 here, put in by the browser) keeps the uploaded
file, since the registry may have attached it."""

from __future__ import annotations

import json
import re

import httpx
from playwright.sync_api import FilePayload, Locator, Page, Request, Route, expect

from preft_serve.toymodels import make_lora_adapter
from tests.browser.console import sign_in, upload_versions
from tests.e2e.stack import Base, Registry
from tests.support.processes import ServiceProcess

NAME = "stale-bot"


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _split_form_on_v1_with_v2_staged(
    page: Page, gateway: ServiceProcess, registry: Registry, base: Base, tenant: str, seed: int
) -> tuple[httpx.Client, Locator]:
    """A new tenant's adapter: version 1 served, version 2 staged; its page open in the
    console, the split form showing version 2 as the canary. The tenant's gateway client
    and the split form."""
    key = registry.create_tenant(tenant)
    upload_versions(registry, base, key, NAME, tenant, (seed, seed + 1))
    sign_in(page, gateway.url, key)
    page.goto(f"{gateway.url}/console/#/adapters/{NAME}")
    split = page.get_by_role("form", name="Set split")
    expect(split.get_by_label("Canary version")).to_have_value("2")
    return httpx.Client(base_url=gateway.url, headers=_auth(key), timeout=60), split


def test_a_split_set_after_a_promote_elsewhere_sends_nothing(
    page: Page, gateway: ServiceProcess, registry: Registry, base: Base
) -> None:
    api, split = _split_form_on_v1_with_v2_staged(
        page, gateway, registry, base, "stale-split", seed=81
    )
    puts: list[str] = []
    page.on(
        "request",
        lambda r: puts.append(r.url) if r.method == "PUT" and r.url.endswith("/policy") else None,
    )

    # Another client promotes version 2 while the page still shows version 1 serving.
    promoted = api.post(f"/v1/adapters/{NAME}/versions/2/promote")
    assert promoted.status_code == 200, promoted.text

    split.get_by_label("Share of users").fill("0.2")
    split.get_by_role("button", name="Set split").click()
    expect(page.get_by_role("alert").filter(has_text="serving version changed")).to_have_text(
        "The serving version changed to v2 since this page loaded: the split was not changed. "
        "The page now shows v2; set the split again to apply it there."
    )
    policy = api.get(f"/v1/adapters/{NAME}/policy").json()
    assert (policy["version"], policy["canary"]) == (2, None)
    assert puts == []
    # The page shows the current policy, and a split set on it now goes through.
    expect(page.locator("dl.row").first.locator("dd").first).to_have_text("version 2")
    expect(split.get_by_label("Canary version")).to_have_value("1")
    split.get_by_label("Share of users").fill("0.2")
    split.get_by_role("button", name="Set split").click()
    expect(page.get_by_role("status")).to_have_text("Setting the split: done.")
    policy = api.get(f"/v1/adapters/{NAME}/policy").json()
    assert policy["version"] == 2
    assert (policy["canary"]["version"], policy["canary"]["weight"]) == (1, 0.2)
    api.close()


def test_a_split_changed_elsewhere_after_the_page_loaded_is_refused_not_overwritten(
    page: Page, gateway: ServiceProcess, registry: Registry, base: Base
) -> None:
    """Another client sets a split while the page shows the policy without one (the serving
    version stays): the page's PUT carries the ETag of the policy it showed, so the
    registry refuses it (412) and the other client's split stands; the page says so and
    shows the split as it is now."""
    api, split = _split_form_on_v1_with_v2_staged(
        page, gateway, registry, base, "stale-tag", seed=83
    )
    elsewhere = api.put(
        f"/v1/adapters/{NAME}/policy", json={"version": 1, "canary": {"version": 2, "weight": 0.5}}
    )
    assert elsewhere.status_code == 200, elsewhere.text
    split.get_by_label("Share of users").fill("0.2")
    split.get_by_role("button", name="Set split").click()
    expect(page.get_by_role("alert").filter(has_text="changed since it was read")).to_have_text(
        f"the serving policy of adapter '{NAME}' changed since it was read (If-Match): it now "
        "serves version 1 with version 2 to 0.5 of users, and nothing was changed; read it "
        "again (GET the policy, whose ETag header is its current tag) and decide anew"
    )
    policy = api.get(f"/v1/adapters/{NAME}/policy").json()
    assert (policy["version"], policy["canary"]["version"], policy["canary"]["weight"]) == (
        1,
        2,
        0.5,
    )
    expect(page.get_by_text("version 2 to 50% of users")).to_be_visible()
    api.close()


def test_an_attach_without_an_answer_keeps_the_uploaded_file(
    page: Page, gateway: ServiceProcess, registry: Registry, base: Base
) -> None:
    key = registry.create_tenant("stale-attach")
    api = httpx.Client(base_url=gateway.url, headers=_auth(key), timeout=60)
    registry.upload(
        key, NAME, make_lora_adapter(base.model, base.root / "stale-attach", seed=83), "prefill"
    )
    deletes: list[str] = []

    def unavailable(route: Route) -> None:
        if route.request.method != "PUT":
            route.continue_()
            return
        error = {"error": {"message": "the registry did not answer in time", "code": "timeout"}}
        route.fulfill(status=503, content_type="application/json", body=json.dumps(error))

    def seen(request: Request) -> None:
        if request.method == "DELETE" and "/v1/files/" in request.url:
            deletes.append(request.url)

    page.route(f"**/v1/adapters/{NAME}/evaluation", unavailable)
    page.on("request", seen)
    sign_in(page, gateway.url, key)
    page.goto(f"{gateway.url}/console/#/adapters/{NAME}")
    expect(page.locator("#evaluation-none")).to_be_visible()

    line = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    form = page.get_by_role("form", name="Attach an evaluation")
    form.get_by_label("Evaluation file").set_input_files(
        FilePayload(
            name="eval.jsonl",
            mimeType="application/jsonl",
            buffer=(json.dumps({"messages": line}) + "\n").encode(),
        )
    )
    form.get_by_role("button", name="Attach evaluation").click()
    error = page.locator("#evaluation-file-error")
    expect(error).to_contain_text("was kept")
    text = error.text_content() or ""
    kept = re.fullmatch(
        r"the registry did not answer in time\. The uploaded file (\S+) was kept: the "
        r"evaluation may or may not have been attached to it \(the gate above is read again\)\.",
        text,
    )
    assert kept is not None, text
    page.wait_for_timeout(500)  # a DELETE, if one were sent, has left by now
    assert deletes == []
    stored = api.get(f"/v1/files/{kept[1]}")
    assert stored.status_code == 200, stored.text
    expect(page.locator("#evaluation-none")).to_be_visible()  # the gate, read again
    assert api.delete(f"/v1/files/{kept[1]}").status_code in (200, 204)
    api.close()


def test_a_promote_after_a_split_elsewhere_is_refused_not_undone(
    page: Page, gateway: ServiceProcess, registry: Registry, base: Base
) -> None:
    """The promote button carries the tag of the policy the page showed: a split another
    client set since is not ended by it (412), and the page redraws what is served now."""
    api, _split = _split_form_on_v1_with_v2_staged(
        page, gateway, registry, base, "stale-promote", seed=91
    )
    split = {"version": 1, "canary": {"version": 2, "weight": 0.07}}
    assert api.put(f"/v1/adapters/{NAME}/policy", json=split).status_code == 200
    page.get_by_role("button", name="Promote version 2").click()
    expect(page.get_by_role("alert").filter(has_text="changed since it was read")).to_be_visible()
    policy = api.get(f"/v1/adapters/{NAME}/policy").json()
    assert (policy["version"], policy["canary"]["version"], policy["canary"]["weight"]) == (
        1,
        2,
        0.07,
    )
    # The redrawn page shows the split (as a whole percentage, no float noise).
    expect(page.get_by_text("version 2 to 7% of users")).to_be_visible()
    api.close()
