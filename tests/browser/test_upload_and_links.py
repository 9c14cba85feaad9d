"""The upload page and crafted links, in Chromium against the real stack: a new version
keeps its adapter's mode unless another is chosen (the registry keeps it when the form
names none), and a link whose adapter name or job id the registry would refuse opens
nothing (a '.' segment would be folded by the browser onto another route)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Page, expect

from preft_serve.toymodels import make_lora_adapter
from tests.browser.console import go, sign_in
from tests.e2e.stack import Base, Registry
from tests.support.processes import ServiceProcess

NAME = "mode-bot"


@pytest.fixture
def tenant(registry: Registry) -> str:
    """A new tenant's key (a name of its own per test)."""
    return registry.create_tenant(f"links-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def api(registry: Registry, tenant: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=registry.url, headers={"Authorization": f"Bearer {tenant}"}, timeout=60
    ) as client:
        yield client


def test_a_new_version_keeps_the_adapters_mode_unless_another_is_chosen(
    page: Page, gateway: ServiceProcess, base: Base, tenant: str, api: httpx.Client
) -> None:
    sign_in(page, gateway.url, tenant)
    go(page, "Upload", "Upload an adapter")
    mode = page.get_by_label("Mode")
    page.get_by_label("Adapter name").fill(NAME)
    mode.select_option("prefill")
    for version, chosen in ((1, "prefill"), (2, None), (3, "all")):
        folder = make_lora_adapter(base.model, base.root / f"{NAME}-v{version}", seed=60 + version)
        if version > 1:
            page.get_by_label("Add a version to an existing adapter").check()
            expect(mode).to_have_value("")  # "keep the adapter's mode"
        if chosen is not None:
            mode.select_option(chosen)
        page.get_by_label("Files", exact=True).set_input_files(sorted(folder.iterdir()))
        page.get_by_role("button", name="Upload").click()
        expect(page.get_by_role("status")).to_contain_text(f"Stored {NAME} version {version}")
    modes = {v["version"]: v["mode"] for v in api.get(f"/v1/adapters/{NAME}").json()["versions"]}
    assert modes == {1: "prefill", 2: "prefill", 3: "all"}
    # Unticked again, a new adapter gets an explicit mode (all by default).
    page.get_by_label("Add a version to an existing adapter").uncheck()
    expect(mode).to_have_value("all")


@pytest.mark.parametrize(
    ("link", "refusal"),
    [
        ("#/adapters/.", "That is not an adapter name"),
        ("#/adapters/a%2F..%2Fkeys", "That is not an adapter name"),
        ("#/fine-tuning/..", "That is not a job id"),
        ("#/adapters/%E0", "That is not an adapter name"),
    ],
)
def test_a_crafted_link_sends_nothing(
    page: Page, gateway: ServiceProcess, tenant: str, link: str, refusal: str
) -> None:
    sign_in(page, gateway.url, tenant)
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if "/v1/" in r.url else None)
    page.goto(f"{gateway.url}/console/{link}")
    expect(page.get_by_role("alert")).to_contain_text(refusal)
    assert sent == []
