"""The console's shell: its security headers, no inline script in what it serves, a key
that never leaves memory, and a layout that fits a narrow window."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import Browser, ViewportSize, expect

from preft_serve.gateway.console import STATIC
from tests.browser.console import go, sign_in
from tests.e2e.stack import Registry
from tests.support.processes import ServiceProcess

EXPECTED_CSP = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "connect-src": "'self'",
    "frame-ancestors": "'none'",
    "base-uri": "'none'",
    "object-src": "'none'",
}


def _policy(header: str) -> dict[str, str]:
    return {
        directive.split()[0]: " ".join(directive.split()[1:])
        for directive in header.split(";")
        if directive.strip()
    }


@pytest.mark.parametrize("path", ["/console/", "/console/app.js", "/console/console.css"])
def test_every_console_answer_carries_the_policy(gateway: ServiceProcess, path: str) -> None:
    reply = httpx.get(f"{gateway.url}{path}", timeout=30)
    assert reply.status_code == 200
    policy = _policy(reply.headers["content-security-policy"])
    assert {name: policy.get(name) for name in EXPECTED_CSP} == EXPECTED_CSP
    assert reply.headers["x-content-type-options"] == "nosniff"
    assert reply.headers["x-frame-options"] == "DENY"


def test_only_packaged_files_are_served(gateway: ServiceProcess) -> None:
    for path in ("/console/nope.js", "/console/%2e%2e/pyproject.toml", "/console/pages/"):
        reply = httpx.get(f"{gateway.url}{path}", timeout=30)
        assert reply.status_code == 404, path
        assert reply.json()["error"]["code"] in {"unknown_url", "not_found"}


def test_no_inline_script_or_markup_sinks_in_the_sources() -> None:
    """Scripts load from files only (the policy would block inline ones anyway), and no
    module writes markup from strings."""
    html = (STATIC / "index.html").read_text()
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) == []
    assert not re.search(r"\son[a-z]+=", html)
    for module in STATIC.rglob("*.js"):
        text = module.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in text, f"{module.name} uses {sink}"


def test_an_injected_inline_script_is_blocked(browser: Browser, gateway: ServiceProcess) -> None:
    """The policy is enforced by the browser: a script element added at run time with
    inline code does not run, and the violation is reported."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{gateway.url}/console/")
        with page.expect_event(
            "console", predicate=lambda line: "Content Security Policy" in line.text
        ) as message:
            page.evaluate(
                """() => {
                    const s = document.createElement("script");
                    s.textContent = "window.__ran = 1";
                    document.body.append(s);
                }"""
            )
        assert "Content Security Policy" in message.value.text
        assert page.evaluate("() => window.__ran === undefined")
    finally:
        context.close()


def test_narrow_window(browser: Browser, gateway: ServiceProcess, registry: Registry) -> None:
    """At 390 pixels wide every section fits without sideways scrolling, and the
    navigation wraps rather than hides."""
    key = registry.create_tenant("narrow")
    context = browser.new_context(viewport=ViewportSize(width=390, height=800))
    try:
        page = context.new_page()
        sign_in(page, gateway.url, key)
        for section, heading in (
            ("Adapters", "Adapters"),
            ("Upload", "Upload an adapter"),
            ("Fine-tuning", "Fine-tuning"),
            ("Users", "Users"),
            ("Playground", "Playground"),
            ("Usage", "Usage"),
            ("Keys", "API keys"),
            ("Audit log", "Audit log"),
        ):
            go(page, section, heading)
            expect(page.locator(".loading")).to_have_count(0)
            widths = page.evaluate(
                "() => [document.documentElement.scrollWidth, window.innerWidth]"
            )
            assert widths[0] <= widths[1], (section, widths)
            expect(page.get_by_role("button", name="Sign out")).to_be_in_viewport()
    finally:
        context.close()
