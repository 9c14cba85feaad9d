"""The Users page loads the registry's bindings a page at a time: the first page, then
"Load more bindings" appends the next until the registry says there is none; the rows are
the registry's own pages, in its order. The registry's page size is narrowed to 2 here by
rewriting the page's requests, so five bindings make three pages."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
from playwright.sync_api import Page, Route, expect

from preft_serve.toymodels import make_lora_adapter
from tests.browser.console import go, sign_in
from tests.e2e.stack import Base, Registry
from tests.support.processes import ServiceProcess

USERS = ["erin", "alice", "dave", "bob", "carol"]
SMALL_PAGE = "2"


def _narrowed(route: Route) -> None:
    parts = urlsplit(route.request.url)
    query = dict(parse_qsl(parts.query))
    query["limit"] = SMALL_PAGE
    route.continue_(url=urlunsplit(parts._replace(query=urlencode(query))))


def test_bindings_load_a_page_at_a_time(
    page: Page, gateway: ServiceProcess, registry: Registry, base: Base
) -> None:
    key = registry.create_tenant("paging")
    auth = {"Authorization": f"Bearer {key}"}
    folder = make_lora_adapter(base.model, base.root / "paging-bot", seed=61)
    registry.upload(key, "paging-bot", folder, "prefill")
    for user in USERS:
        bound = httpx.put(
            f"{gateway.url}/v1/users/{user}", json={"adapter": "paging-bot"}, headers=auth
        )
        assert bound.status_code == 200, bound.text
    pages, cursor = [], None
    while True:  # the registry's own pages, through the gateway
        params = {"limit": SMALL_PAGE, **({"cursor": cursor} if cursor else {})}
        answer = httpx.get(f"{gateway.url}/v1/users", params=params, headers=auth).json()
        pages.append([b["user"] for b in answer["items"]])
        cursor = answer["next_cursor"]
        if cursor is None:
            break
    assert pages == [["alice", "bob"], ["carol", "dave"], ["erin"]]

    page.route("**/v1/users?*", _narrowed)
    sign_in(page, gateway.url, key)
    go(page, "Users", "Users")
    rows = page.locator("table tbody tr")
    more = page.get_by_role("button", name="Load more bindings")
    for loaded in (2, 4):
        expect(rows).to_have_count(loaded)
        expect(page.get_by_text(f"({loaded} of the bindings loaded)")).to_be_visible()
        expect(rows.first).to_contain_text("alice")
        more.click()
    expect(rows).to_have_count(5)
    expect(page.get_by_text("(5 bindings)")).to_be_visible()
    expect(more).to_be_hidden()
    shown = [rows.nth(i).locator("td").first.inner_text() for i in range(5)]
    assert shown == [user for each in pages for user in each]
