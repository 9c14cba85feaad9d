"""Tenant-controlled strings the console shows (file names it lists, user ids and key
names the API echoes in its refusals) stay text: markup, event-handler attributes, a
right-to-left override and 10,000 characters are shown as the API sent them, and nothing
in them runs or becomes an element."""

from __future__ import annotations

import secrets
from urllib.parse import quote

import httpx
import pytest
from playwright.sync_api import FilePayload, Page, expect

from tests.browser.console import go, sign_in
from tests.e2e.stack import Registry
from tests.support.processes import ServiceProcess

HOSTILE = [
    "<img src=x onerror=window.__pwned=1>",
    '"><svg onload=window.__pwned=2>',
    '" onerror="window.__pwned=3',
    "\u202egnp.lmth<b>bold</b>",
    "<" + "a" * 10_000,
]


def _assert_inert(page: Page) -> None:
    """No string ran (``window.__pwned``) or became an element."""
    found = page.evaluate(
        """() => ({
            pwned: window.__pwned === undefined ? null : window.__pwned,
            scripts: [...document.scripts].map((s) => s.getAttribute("src")),
            injected: document.querySelectorAll("img, svg, b, [onerror], [onload]").length,
        })"""
    )
    assert found == {"pwned": None, "scripts": ["/console/app.js"], "injected": 0}


def _message(reply: httpx.Response) -> str:
    assert 400 <= reply.status_code < 500, reply.text
    return str(reply.json()["error"]["message"])


@pytest.fixture
def key(registry: Registry) -> str:
    return registry.create_tenant(f"hostile-{secrets.token_hex(4)}")


def test_uploaded_file_names_are_listed_and_refused_as_text(
    page: Page, gateway: ServiceProcess, key: str
) -> None:
    sign_in(page, gateway.url, key)
    go(page, "Upload", "Upload an adapter")
    for name in HOSTILE:
        page.get_by_label("Adapter name").fill("hostile-bot")
        payload = FilePayload(name=name, mimeType="application/octet-stream", buffer=b"{}")
        page.get_by_label("Files", exact=True).set_input_files([payload])
        listed = page.get_by_role("list", name="Chosen files").locator("li")
        expect(listed).to_have_text(f"{name} (2 bytes)")
        page.get_by_role("button", name="Upload").click()
        # The refusal shown is the gateway's own message for the same upload.
        reference = httpx.post(
            f"{gateway.url}/v1/adapters",
            data={"name": "hostile-bot", "mode": "all"},
            files=[("files", (name, b"{}", "application/octet-stream"))],
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        expect(page.locator("#file-error")).to_have_text(_message(reference))
        _assert_inert(page)
    listing = httpx.get(
        f"{gateway.url}/v1/adapters", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    assert listing.json()["items"] == []  # every refusal stored nothing


def test_echoed_user_ids_and_key_names_are_text(
    page: Page, gateway: ServiceProcess, key: str
) -> None:
    sign_in(page, gateway.url, key)
    auth = {"Authorization": f"Bearer {key}"}
    go(page, "Users", "Users")
    for name in HOSTILE[:4]:  # a 10,000-character user id is a URL no server reads
        page.get_by_label("User id").fill(name)
        page.get_by_label("Adapter", exact=True).fill("no-such-bot")
        page.get_by_role("button", name="Bind").click()
        reference = httpx.put(
            f"{gateway.url}/v1/users/{quote(name, safe='')}",
            json={"adapter": "no-such-bot"},
            headers=auth,
            timeout=30,
        )
        expect(page.get_by_role("alert")).to_have_text(_message(reference))
        _assert_inert(page)
    go(page, "Keys", "API keys")
    for name in HOSTILE:
        page.get_by_label("Name (optional)").fill(name)
        page.get_by_role("button", name="Issue key").click()
        reference = httpx.post(
            f"{gateway.url}/v1/keys",
            json={"role": "inference", "name": name},
            headers=auth,
            timeout=30,
        )
        expect(page.get_by_role("alert")).to_have_text(_message(reference))
        _assert_inert(page)
    keys = httpx.get(f"{gateway.url}/v1/keys", headers=auth, timeout=30).json()
    assert len(keys) == 1  # the tenant's first key only: nothing was issued
