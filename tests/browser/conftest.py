"""The browser tier: the web console in Debian's headless Chromium (Playwright drives
``/usr/bin/chromium``; ``playwright install`` is never run) against the e2e stack's real
processes: one vLLM worker, the registry, and a gateway that forwards to that registry.
The stack and the browser start once for the package; every test signs in as a tenant
of its own."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Playwright, ViewportSize, sync_playwright

from tests.e2e.conftest import base, namespace, registry, worker
from tests.e2e.stack import Base, Registry, running_gateway
from tests.support.processes import ServiceProcess

__all__ = ["base", "namespace", "registry", "worker"]  # the e2e stack's fixtures, reused

CHROMIUM = Path("/usr/bin/chromium")
WIDE = ViewportSize(width=1280, height=800)
# `make console-shots` sets this to docs/console: the journey saves each page there.
SHOTS = os.environ.get("PREFT_CONSOLE_SHOTS")


@pytest.fixture(scope="package")
def gateway(
    base: Base, redis_server: str, namespace: str, worker: ServiceProcess, registry: Registry
) -> Iterator[ServiceProcess]:
    """The gateway, forwarding the tenant routes (adapters, users, usage, keys, audit) to
    the registry, as a deployment's one URL; the registry's admin token opens its operator
    view."""
    env = {"PREFT_GATEWAY_REGISTRY_URL": registry.url, "PREFT_GATEWAY_ADMIN_TOKEN": registry.admin}
    with running_gateway(
        base.root, redis_server, namespace, base.model, [worker.url], extra_env=env
    ) as process:
        yield process


@pytest.fixture(scope="package")
def playwright() -> Iterator[Playwright]:
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: scripts/system-packages.sh test installs it")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="package")
def browser(playwright: Playwright) -> Iterator[Browser]:
    chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
    try:
        yield chromium
    finally:
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context (no cookies, no storage) at 1280x800 that fails the test on
    any script error or CSP violation it logs."""
    context = browser.new_context(viewport=WIDE)
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    tab.on(
        "console",
        lambda message: (
            problems.append(f"console {message.type}: {message.text}")
            if message.type == "error" and "Content Security Policy" in message.text
            else None
        ),
    )
    try:
        yield tab
    finally:
        context.close()
    assert not problems, problems
