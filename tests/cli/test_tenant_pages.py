"""``preft tenant list`` follows the registry's next links, and only to its own tenant list:
the admin token goes with every request, so a link elsewhere is refused, not followed."""

from __future__ import annotations

import argparse

import httpx
import pytest

from preft_serve.cli.client import CliError, Registry
from preft_serve.cli.tenant import cmd_list


def _registry(pages: dict[str, httpx.Response], sent: list[httpx.Request]) -> Registry:
    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return pages[str(request.url)]

    reg = Registry("http://registry.test", "admin-secret", timeout=5)
    reg.http = httpx.Client(
        base_url=reg.url,
        headers={"Authorization": "Bearer admin-secret"},
        transport=httpx.MockTransport(answer),
    )
    return reg


def _page(names: list[str], link: str | None) -> httpx.Response:
    headers = {"Link": f'<{link}>; rel="next"'} if link else {}
    return httpx.Response(200, json=[{"name": n} for n in names], headers=headers)


def test_the_pages_are_followed_to_the_end() -> None:
    sent: list[httpx.Request] = []
    reg = _registry(
        {
            "http://registry.test/v1/tenants?limit=1000": _page(["a"], "/v1/tenants?after=a"),
            "http://registry.test/v1/tenants?after=a": _page(["b"], None),
        },
        sent,
    )
    assert [t["name"] for t in cmd_list(reg, argparse.Namespace())] == ["a", "b"]
    assert len(sent) == 2


@pytest.mark.parametrize(
    "link", ["https://elsewhere.test/v1/tenants?after=a", "/v1/keys?after=a", "//x.test/"]
)
def test_a_next_link_elsewhere_is_refused_and_not_followed(link: str) -> None:
    sent: list[httpx.Request] = []
    reg = _registry({"http://registry.test/v1/tenants?limit=1000": _page(["a"], link)}, sent)
    with pytest.raises(CliError, match="not a tenant list of its own"):
        cmd_list(reg, argparse.Namespace())
    assert [str(r.url) for r in sent] == ["http://registry.test/v1/tenants?limit=1000"]
