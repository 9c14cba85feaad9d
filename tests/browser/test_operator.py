"""The operator view in Chromium, signed in with the registry's admin token: the tenants
with their quotas are the registry's, the worker shows the adapter it loaded for a
request served just before, the warm-hit share is the gateway's own metric, and tenant
names and key names (hostile ones too) stay text. A tenant's key never gets the view."""

from __future__ import annotations

import json
import re
import time

import httpx
from playwright.sync_api import Page, Route, ViewportSize, expect

from preft_serve.toymodels import make_lora_adapter
from tests.browser.console import shot, sign_in
from tests.browser.test_hostile_strings import HOSTILE, _assert_inert
from tests.e2e.stack import Base, Registry, complete
from tests.support.processes import ServiceProcess

TENANT = "ops-acme"
ADAPTER = "ops-bot"
TENANT_LINKS = ("Adapters", "Upload", "Users", "Fine-tuning", "Playground", "Usage", "Keys")


def _admin_get(url: str, token: str, path: str) -> httpx.Response:
    reply = httpx.get(f"{url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply


def _sign_in_as_operator(page: Page, gateway: str, token: str) -> None:
    page.goto(f"{gateway}/console/")
    field = page.get_by_label("API key")
    field.fill(token)
    field.press("Enter")
    expect(page.get_by_role("heading", name="Operator", exact=True)).to_be_visible()


def _resident(worker: str) -> set[str]:
    """The adapters the worker itself lists as loaded (its vLLM ``/v1/models``)."""
    models = httpx.get(f"{worker}/v1/models", timeout=30).json()["data"]
    return {m["id"].removeprefix("sha256:") for m in models if m["id"].startswith("sha256:")}


def _warm_share(gateway: str) -> str:
    """The warm-hit share from the gateway's Prometheus page, as the page words it."""
    counts: dict[str, float] = {}
    for line in httpx.get(f"{gateway}/metrics", timeout=30).text.splitlines():
        if line.startswith("preft_gateway_routing_total{"):
            result = line.split('result="', 1)[1].split('"', 1)[0]
            counts[result] = float(line.rsplit(" ", 1)[1])
    assert counts.get("resident", 0) >= 1, counts
    return f"{counts['resident'] / sum(counts.values()) * 100:.1f} %"


def test_the_operator_sees_tenants_quotas_and_the_workers_resident_adapters(
    page: Page, gateway: ServiceProcess, registry: Registry, worker: ServiceProcess, base: Base
) -> None:
    key = registry.create_tenant(TENANT)
    admin = {"Authorization": f"Bearer {registry.admin}"}
    patched = httpx.patch(
        f"{registry.url}/v1/tenants/{TENANT}",
        json={"quota": {"max_adapters": 3}},
        headers=admin,
        timeout=30,
    )
    assert patched.status_code == 200, patched.text
    named = httpx.post(
        f"{registry.url}/v1/keys",
        json={"role": "inference", "name": "ci deploy"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert named.status_code == 201, named.text
    adapter = make_lora_adapter(base.model, base.root / "ops-bot", seed=61)
    sha = registry.upload(key, ADAPTER, adapter, "prefill")["sha256"]
    served = complete(gateway.url, api_key=key, model=ADAPTER)  # a cold load
    assert served.status_code == 200, served.text
    assert sha in _resident(worker.url)

    _sign_in_as_operator(page, gateway.url, registry.admin)
    nav = page.get_by_role("navigation")
    expect(nav.get_by_role("link", name="Operator")).to_be_visible()
    for name in TENANT_LINKS:
        expect(nav.get_by_role("link", name=name, exact=True)).to_be_hidden()

    # The tenants table is the registry's list, quota included.
    listed = {t["name"]: t for t in _admin_get(registry.url, registry.admin, "/v1/tenants").json()}
    tenants = page.get_by_role("region", name="Tenants")
    row = tenants.locator("tbody tr").filter(has=page.get_by_role("button", name=TENANT))
    day = re.compile(r"^\d{4}-\d\d-\d\dT")  # the console's own date format
    expect(row.locator("td")).to_have_text(
        [TENANT, day, str(listed[TENANT]["adapters"]), "3", "default"], timeout=10_000
    )
    assert listed[TENANT]["quota"]["max_adapters"] == 3
    expect(tenants.locator("caption")).to_contain_text(f"of {len(listed)} tenants")

    # The worker row: healthy, and the adapter it lists as loaded (refreshed until seen).
    workers = page.get_by_role("region", name="Workers")
    worker_row = workers.locator("tbody tr").filter(has_text=worker.url)
    deadline = time.monotonic() + 30
    while worker_row.locator("summary").count() == 0:
        assert time.monotonic() < deadline, worker_row.inner_text()
        page.get_by_role("button", name="Refresh").click()
        page.wait_for_timeout(500)
    expect(worker_row.locator("td").nth(1)).to_have_text("healthy")
    expect(worker_row.locator("summary")).to_have_text(f"{len(_resident(worker.url))} loaded")
    worker_row.locator("summary").click()
    expect(worker_row.locator(f'li[title="{sha}"]')).to_have_text(sha[:12])
    # The gateway has seen it loaded there: the next request is a warm hit.
    served = complete(gateway.url, api_key=key, model=ADAPTER)
    assert served.status_code == 200, served.text
    routing = page.get_by_role("region", name="Routing")
    page.get_by_role("button", name="Refresh").click()
    expect(routing.locator("dd").first).to_have_text(_warm_share(gateway.url))
    expect(routing).to_contain_text("No decode pool")

    page.evaluate("() => window.scrollTo(0, 0)")
    shot(page, "operator")

    # A tenant's detail: its quota, rate limits and key names, no secret.
    tenants.get_by_role("button", name=TENANT).click()
    expect(tenants.get_by_role("heading", name=f"Tenant {TENANT}")).to_be_visible()
    expect(tenants.get_by_role("cell", name="ci deploy")).to_be_visible()
    assert key not in page.content()

    # At 390 pixels wide the page fits without sideways scrolling.
    page.set_viewport_size(ViewportSize(width=390, height=800))
    widths = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], widths


def test_the_tenant_list_is_read_page_by_page_through_the_registrys_links(
    page: Page, gateway: ServiceProcess, registry: Registry
) -> None:
    """The registry answers a page of tenants with a Link to the next; here its pages are
    one tenant each (the console's first request is sent with ``limit=1``): the console
    follows every link through the gateway, and the table holds every tenant."""
    for name in ("paged-a", "paged-b", "paged-c"):
        registry.create_tenant(name)
    names = [t["name"] for t in _admin_get(registry.url, registry.admin, "/v1/tenants").json()]
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/v1/tenants" in r.url else None)
    page.route(
        "**/v1/tenants",
        lambda route: route.continue_(url=route.request.url + "?limit=1"),
        times=1,
    )
    _sign_in_as_operator(page, gateway.url, registry.admin)
    tenants = page.get_by_role("region", name="Tenants")
    expect(tenants.locator("caption")).to_contain_text(f"of {len(names)} tenants")
    assert len(asked) == len(names), asked  # one page per tenant, the last without a link
    assert all(url.startswith(f"{gateway.url}/v1/tenants?limit=1") for url in asked[1:]), asked
    tenants.get_by_label("Filter by name").fill("paged-")
    expect(tenants.locator("tbody tr td:first-child")).to_have_text(
        ["paged-a", "paged-b", "paged-c"]
    )


def test_hostile_tenant_and_key_names_stay_text(
    page: Page, gateway: ServiceProcess, registry: Registry
) -> None:
    """The registry refuses such tenant names, so the answers are replaced in the browser:
    the page must keep them inert whatever the API sends."""
    tenants = [
        {"name": name, "created_at": "2026-01-01T00:00:00Z", "adapters": 0, "quota": {}}
        for name in HOSTILE
    ]
    detail = {
        "name": HOSTILE[0],
        "created_at": "2026-01-01T00:00:00Z",
        "quota": {},
        "unbound_user": HOSTILE[1],
        "keys": [
            {"key_id": "k1", "created_at": "2026-01-01T00:00:00Z", "role": "admin", "name": n}
            for n in HOSTILE
        ],
    }

    def answer(route: Route) -> None:
        path = route.request.url.split("/v1/tenants", 1)[1]
        body = (
            tenants if path == "" else {"tenant_rps": None} if path.endswith("/limits") else detail
        )
        route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

    page.route("**/v1/tenants**", answer)
    _sign_in_as_operator(page, gateway.url, registry.admin)
    region = page.get_by_role("region", name="Tenants")
    for name in HOSTILE:
        expect(region.get_by_role("button", name=name, exact=True)).to_have_count(1)
    region.get_by_role("button", name=HOSTILE[0], exact=True).click()
    expect(region.get_by_role("heading", name=f"Tenant {HOSTILE[0]}")).to_be_visible()
    keys = region.locator("table").last
    for name in HOSTILE:
        expect(keys.get_by_role("cell", name=name, exact=True)).to_have_count(1)
    _assert_inert(page)


def test_a_tenant_key_gets_no_operator_view(
    page: Page, gateway: ServiceProcess, registry: Registry
) -> None:
    key = registry.create_tenant("ops-tenant")
    for path in ("/v1/operator/workers", "/v1/operator/routing", "/v1/tenants"):
        refused = httpx.get(f"{gateway.url}{path}", headers={"Authorization": f"Bearer {key}"})
        assert refused.status_code == 401, (path, refused.text)
    sign_in(page, gateway.url, key)
    expect(page.get_by_role("navigation").get_by_role("link", name="Operator")).to_be_hidden()
    page.evaluate("() => { location.hash = '#/operator'; }")
    expect(page.get_by_role("heading", name="Adapters")).to_be_visible()
    expect(page.get_by_role("heading", name="Operator", exact=True)).to_have_count(0)


def _workers_page(label: str, more: bool) -> str:
    """A workers answer of one row (``label`` in its URL), as the operator route words it."""
    row = {
        "url": f"http://{label}:8000",
        "healthy": True,
        "failures": 0,
        "inflight": 0,
        "others": 0,
        "resident_count": 0,
        "resident": [],
    }
    body = {"data": [row], "total": 2, "healthy": 2, "cap": None, "has_more": more}
    return json.dumps({**body, "last": row["url"]})


def _tenant_answer(url: str) -> str:
    """The answer of a tenant route: the list, a tenant's limits or its details."""
    path = url.split("/v1/tenants", 1)[1].split("?", 1)[0]
    if path == "":
        return json.dumps(
            [
                {"name": n, "created_at": "2026-01-01T00:00:00Z", "adapters": 0, "quota": {}}
                for n in ("late-a", "late-b")
            ]
        )
    if path.endswith("/limits"):
        return json.dumps({"tenant_rps": None})
    name = path.strip("/")
    created = "2026-01-01T00:00:00Z"
    return json.dumps(
        {"name": name, "created_at": created, "quota": {}, "unbound_user": "reject", "keys": []}
    )


def test_late_answers_are_dropped_and_each_whole_served_reason_shows(
    page: Page, gateway: ServiceProcess, registry: Registry
) -> None:
    """With the answers replaced in the browser: a decode pool's lines (each reason for
    serving a request whole on its own line); a workers page 1 that answers after Next drew
    page 2, and tenant A's details that answer after tenant B's, are not drawn."""
    routing = {
        "decisions": {"resident": 1, "preferred": 1, "replica": 0, "spill": 0},
        "warm_hit_share": 0.5,
        "handoffs": {"decoded": 1, "first_token": 2, "fallback": 3, "decode_failed": 4},
        "unified": {"all_token_adapter": 5, "one_token": 6, "option": 7},
        "decode_pool": True,
        "started_at": 1_700_000_000,
    }
    held: list[Route] = []  # answers the test releases after later ones were drawn
    hold_first_pages = [False]

    def workers(route: Route) -> None:
        url = route.request.url
        if "pool=decode" in url:
            body = json.dumps(
                {"data": [], "total": 0, "healthy": 0, "cap": None, "has_more": False}
            )
        elif "after=" in url:
            body = _workers_page("page-two", False)
        elif hold_first_pages[0]:
            held.append(route)
            return
        else:
            body = _workers_page("page-one", True)
        route.fulfill(status=200, content_type="application/json", body=body)

    def tenant_routes(route: Route) -> None:
        if "/v1/tenants/late-a" in route.request.url:
            held.append(route)
            return
        route.fulfill(
            status=200, content_type="application/json", body=_tenant_answer(route.request.url)
        )

    def wait_held(count: int) -> None:
        for _ in range(200):
            if len(held) >= count:
                return
            page.wait_for_timeout(50)
        raise AssertionError(f"{len(held)} calls held, {count} expected")

    page.route("**/v1/operator/routing", lambda r: r.fulfill(json=routing))
    page.route("**/v1/operator/workers**", workers)
    page.route("**/v1/tenants**", tenant_routes)
    _sign_in_as_operator(page, gateway.url, registry.admin)

    region = page.get_by_role("region", name="Routing")
    expect(region.locator("dt").last).to_have_text("Served whole: an option spans both hops")
    terms = region.locator("dt").all_inner_texts()
    values = region.locator("dd").all_inner_texts()
    shown = dict(zip(terms, values, strict=True))
    assert {k: v for k, v in shown.items() if k.startswith("Served whole")} == {
        "Served whole: all-token adapter": "5",
        "Served whole: max_tokens 1": "6",
        "Served whole: an option spans both hops": "7",
    }

    # Workers: a refresh of page 1 is held, Next draws page 2, then page 1 answers.
    pool = page.get_by_role("region", name="Workers")
    expect(pool.locator("tbody")).to_contain_text("page-one")
    hold_first_pages[0] = True
    page.get_by_role("button", name="Refresh").click()
    wait_held(1)
    pool.get_by_role("button", name="Next").click()
    expect(pool.locator("tbody")).to_contain_text("page-two")
    for route in held:
        route.fulfill(
            status=200, content_type="application/json", body=_workers_page("page-one", True)
        )
    held.clear()
    page.wait_for_timeout(500)
    expect(pool.locator("tbody")).to_contain_text("page-two")
    expect(pool.get_by_role("button", name="Previous")).to_be_enabled()
    expect(pool.get_by_role("button", name="Next")).to_be_disabled()

    # Tenants: A's details are held, B's drawn, then A's answer.
    tenants = page.get_by_role("region", name="Tenants")
    tenants.get_by_role("button", name="late-a", exact=True).click()
    wait_held(2)
    tenants.get_by_role("button", name="late-b", exact=True).click()
    expect(tenants.get_by_role("heading", name="Tenant late-b")).to_be_visible()
    for route in held:
        route.fulfill(
            status=200, content_type="application/json", body=_tenant_answer(route.request.url)
        )
    held.clear()
    page.wait_for_timeout(500)
    expect(tenants.get_by_role("heading", name="Tenant late-b")).to_be_visible()
    expect(tenants.get_by_role("heading", name="Tenant late-a")).to_have_count(0)
