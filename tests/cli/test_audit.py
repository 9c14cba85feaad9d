"""``preft audit`` against a live registry: the table shows each change the registry
recorded, ``--output json`` is the API's page, filters and ``--all`` reach the same entries
as the REST API, and a tenant never sees another tenant's entries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.cli import run_cli
from tests.support.registry_api import ADMIN_TOKEN, admin, bearer


def _tenant(url: str, name: str) -> dict[str, Any]:
    made = httpx.post(f"{url}/v1/tenants", json={"name": name}, headers=admin(), timeout=30)
    assert made.status_code == 201, made.text
    return made.json()  # type: ignore[no-any-return]


def _rest(url: str, key: str, **params: Any) -> dict[str, Any]:
    """The registry's own answer, read without the CLI: the reference."""
    page = httpx.get(f"{url}/v1/audit", params=params, headers=bearer(key), timeout=30)
    assert page.status_code == 200, page.text
    return page.json()  # type: ignore[no-any-return]


@pytest.fixture
def acme(live_server: str, tmp_path: Path) -> dict[str, Any]:
    """acme, with changes by the operator (quota, a second key) and by its own key (two
    file uploads); globex, with an upload of its own that acme must never see."""
    made = _tenant(live_server, "acme")
    globex = _tenant(live_server, "globex")
    quota = httpx.patch(
        f"{live_server}/v1/tenants/acme",
        json={"quota": {"max_adapters": 7}},
        headers=admin(),
        timeout=30,
    )
    assert quota.status_code == 200, quota.text
    key = httpx.post(f"{live_server}/v1/tenants/acme/keys", headers=admin(), timeout=30)
    assert key.status_code == 201, key.text
    for owner, name in ((made, "a1"), (made, "a2"), (globex, "g1")):
        line = {
            "messages": [{"role": "user", "content": name}, {"role": "assistant", "content": "ok"}]
        }
        sent = httpx.post(
            f"{live_server}/v1/files",
            data={"purpose": "fine-tune"},
            files={"file": (f"{name}.jsonl", json.dumps(line) + "\n")},
            headers=bearer(owner["api_key"]),
            timeout=30,
        )
        assert sent.status_code == 200, sent.text
    return {**made, "url": live_server, "globex_key": globex["api_key"]}


def test_the_table_shows_every_change_with_before_and_after(
    acme: dict[str, Any], capsys: Any
) -> None:
    common = ("--url", acme["url"], "--api-key", acme["api_key"])
    code, out, err = run_cli(capsys, "audit", *common)
    assert (code, err) == (0, "")
    expected = _rest(acme["url"], acme["api_key"])["data"]
    header, *rows = out.splitlines()
    assert header.split() == ["TIME", "ACTOR", "ACTION", "TARGET", "CHANGE"]
    assert len(rows) == len(expected) >= 5
    for row, entry in zip(rows, expected, strict=True):
        change = f"{entry['before'] or '-'} \u2192 {entry['after'] or '-'}"
        assert row.split() == [
            entry["time"],
            entry["actor"],
            entry["action"],
            entry["target"],
            *change.split(),
        ]
    assert [e["action"] for e in expected][:3] == ["tenant.create", "tenant.update", "key.create"]
    assert rows[0].split()[1:] == [
        "operator",
        "tenant.create",
        "acme",
        "-",
        "\u2192",
        acme["key_id"],
    ]
    uploads = [r.split() for r in rows if " file.upload " in r]
    assert [r[1] for r in uploads] == [acme["key_id"]] * 2  # the acting key, not operator


def test_json_is_the_apis_page_and_filters_reach_the_registry(
    acme: dict[str, Any], capsys: Any
) -> None:
    common = ("--url", acme["url"], "--api-key", acme["api_key"], "--output", "json")
    code, out, _ = run_cli(capsys, "audit", *common)
    assert code == 0 and json.loads(out) == _rest(acme["url"], acme["api_key"])

    code, out, _ = run_cli(
        capsys,
        "audit",
        "--action",
        "file.upload",
        "--actor",
        acme["key_id"],
        "--limit",
        "1",
        *common,
    )
    page = json.loads(out)
    assert code == 0 and page == _rest(
        acme["url"], acme["api_key"], action="file.upload", actor=acme["key_id"], limit=1
    )
    assert len(page["data"]) == 1 and page["next_cursor"] is not None

    # --all follows the cursor: both uploads, and nothing left.
    code, out, _ = run_cli(
        capsys, "audit", "--action", "file.upload", "--limit", "1", "--all", *common
    )
    everything = json.loads(out)
    assert code == 0 and everything["next_cursor"] is None
    assert everything["data"] == _rest(acme["url"], acme["api_key"], action="file.upload")["data"]
    assert len(everything["data"]) == 2

    # --since/--until bound by time: nothing after the last entry, everything up to it.
    last = everything["data"][-1]["time"]
    code, out, _ = run_cli(capsys, "audit", "--until", last, "--all", *common)
    assert code == 0
    assert json.loads(out)["data"] == _rest(acme["url"], acme["api_key"], limit=500)["data"]
    code, out, _ = run_cli(capsys, "audit", "--since", "2999-01-01", *common)
    assert code == 0 and json.loads(out)["data"] == []


def test_a_tenant_sees_only_its_own_entries(acme: dict[str, Any], capsys: Any) -> None:
    common = ("--url", acme["url"], "--output", "json")
    code, out, _ = run_cli(capsys, "audit", "--all", "--api-key", acme["api_key"], *common)
    assert code == 0
    mine = json.loads(out)["data"]
    code, out, _ = run_cli(capsys, "audit", "--all", "--api-key", acme["globex_key"], *common)
    assert code == 0
    theirs = json.loads(out)["data"]
    assert {e["tenant"] for e in mine} == {"acme"} and {e["tenant"] for e in theirs} == {"globex"}
    assert not {e["id"] for e in mine} & {e["id"] for e in theirs}
    every = httpx.get(
        f"{acme['url']}/v1/audit", params={"limit": 500}, headers=admin(), timeout=30
    ).json()["data"]  # the operator's view
    assert sorted(e["id"] for e in mine + theirs) == sorted(e["id"] for e in every)


def test_a_page_with_more_says_how_to_go_on_and_an_empty_one_says_so(
    acme: dict[str, Any], capsys: Any
) -> None:
    common = ("--url", acme["url"], "--api-key", acme["api_key"])
    code, out, _ = run_cli(capsys, "audit", "--limit", "2", *common)
    cursor = _rest(acme["url"], acme["api_key"], limit=2)["next_cursor"]
    assert code == 0 and out.splitlines()[-1] == f"(more: --all, or --after {cursor})"
    code, out, _ = run_cli(capsys, "audit", "--limit", "2", "--after", cursor, *common)
    assert (
        code == 0
        and out.splitlines()[1].split()[0]
        == _rest(acme["url"], acme["api_key"], limit=2, after=cursor)["data"][0]["time"]
    )
    code, out, _ = run_cli(capsys, "audit", "--since", "2999-01-01", *common)
    assert (code, out) == (0, "no audit entries\n")


def test_a_bad_filter_is_the_registrys_message_and_exit_1(
    acme: dict[str, Any], capsys: Any
) -> None:
    code, out, err = run_cli(
        capsys, "audit", "--since", "yesterday", "--url", acme["url"], "--api-key", acme["api_key"]
    )
    assert code == 1 and out == ""
    assert err.startswith("error: ") and "since" in err and "(HTTP 400)" in err
    code, _, err = run_cli(
        capsys, "audit", "--limit", "many", "--url", acme["url"], "--api-key", acme["api_key"]
    )
    assert code == 2 and "--limit" in err  # argparse: not an integer
    assert ADMIN_TOKEN not in err
