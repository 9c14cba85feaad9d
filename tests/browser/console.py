"""Steps the console tests share: open the console, sign in, go to a page, save a shot,
upload an adapter's versions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from playwright.sync_api import Page, expect

from preft_serve.toymodels import make_lora_adapter
from tests.browser.conftest import SHOTS
from tests.e2e.stack import Base, Registry


def sign_in(page: Page, gateway: str, key: str) -> None:
    """Open the console and sign in from the keyboard (type the key, press Enter)."""
    page.goto(f"{gateway}/console/")
    field = page.get_by_label("API key")
    expect(field).to_be_focused()
    field.fill(key)
    field.press("Enter")
    expect(page.get_by_role("heading", name="Adapters")).to_be_visible()


def go(page: Page, section: str, heading: str) -> None:
    page.get_by_role("navigation").get_by_role("link", name=section).click()
    expect(page.get_by_role("heading", name=heading, exact=True)).to_be_visible()


def shot(page: Page, name: str) -> None:
    """Save the page to ``$PREFT_CONSOLE_SHOTS/<name>.png`` (docs/console.md's images)."""
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=False)


def upload_versions(
    registry: Registry,
    base: Base,
    key: str,
    name: str,
    tag: str,
    seeds: Sequence[int],
    first_version: int = 1,
) -> None:
    """Upload one PreFT LoRA version of ``name`` per seed, numbered from ``first_version``
    (folders ``<tag>-v<N>``): version 1 is served, every later one staged."""
    for version, seed in enumerate(seeds, first_version):
        folder = make_lora_adapter(base.model, base.root / f"{tag}-v{version}", seed=seed)
        registry.upload(key, name, folder, "prefill", new_version=version > 1, promote=False)
