"""Steps the console tests share: open the console, sign in, go to a page, save a shot."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Page, expect

from tests.browser.conftest import SHOTS


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
