"""A tenant reads its audit log through the gateway, against a real registry (in-process over
loopback HTTP, on the suite's Redis): the page is the registry's own answer for the same
key and query, changes made through the gateway carry its request id, and no other
tenant's entries ever show."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests.finetune.conftest import chat_jsonl
from tests.gateway import test_registry_slots as slots
from tests.gateway.test_registry_slots import Stack

# The real registry and gateway of the slots tests (fixtures, found by name).
model_dir, stack = slots.model_dir, slots.stack


def _audit(s: Stack, key: str, via_gateway: bool, **params: Any) -> httpx.Response:
    if via_gateway:
        return s.call(key, "GET", "/v1/audit", params=params)
    return s.registry.call(key, "GET", "/v1/audit", params=params)


def test_a_tenants_audit_log_through_the_gateway_is_the_registrys(
    stack: Callable[..., Stack],
) -> None:
    s = stack()
    acme, globex = s.registry.tenant("acme"), s.registry.tenant("globex")
    uploads = {}
    for key, trace in ((acme, "trace-acme-1"), (acme, "trace-acme-2"), (globex, "trace-g")):
        made = httpx.post(
            f"{s.gateway}/v1/files",
            data={"purpose": "fine-tune"},
            timeout=30,
            headers={"Authorization": f"Bearer {key}", "X-Request-Id": trace},
            files={"file": (f"{trace}.jsonl", chat_jsonl({trace: "ok"}), "application/jsonl")},
        )
        assert made.status_code == 200, made.text
        uploads[trace] = made.json()["id"]

    for params in ({}, {"action": "file.upload"}, {"action": "file.upload", "limit": 1}):
        through = _audit(s, acme, True, **params)
        direct = _audit(s, acme, False, **params)
        assert through.status_code == direct.status_code == 200, through.text
        assert through.json() == direct.json()

    # Following the cursor through the gateway reads exactly the registry's entries.
    entries, after = [], None
    while True:
        page = _audit(s, acme, True, limit=1, **({"after": after} if after else {})).json()
        entries += page["data"]
        if (after := page["next_cursor"]) is None:
            break
    assert entries == _audit(s, acme, False, limit=500).json()["data"]
    uploaded = [e for e in entries if e["action"] == "file.upload"]
    assert [(e["target"], e["request_id"]) for e in uploaded] == [
        (uploads["trace-acme-1"], "trace-acme-1"),
        (uploads["trace-acme-2"], "trace-acme-2"),
    ]
    assert {e["tenant"] for e in entries} == {"acme"}
    assert uploads["trace-g"] not in {e["target"] for e in entries}

    # Another tenant's log is refused by the registry, and the refusal reaches the client.
    other = _audit(s, acme, True, tenant="globex")
    assert other.status_code == 400, other.text
    assert other.json() == _audit(s, acme, False, tenant="globex").json()
    assert other.json()["error"]["param"] == "tenant"
    mine = _audit(s, globex, True).json()["data"]
    assert {e["tenant"] for e in mine} == {"globex"}
    assert [e["target"] for e in mine if e["action"] == "file.upload"] == [uploads["trace-g"]]

    # A bad filter is the registry's 400, relayed as it is.
    bad = _audit(s, acme, True, since="yesterday")
    assert bad.status_code == 400 and bad.json() == _audit(s, acme, False, since="yesterday").json()


def test_a_keyless_or_wrong_key_audit_read_is_the_gateways_401(stack: Callable[..., Stack]) -> None:
    s = stack()
    s.registry.tenant("acme")
    keyless = httpx.get(f"{s.gateway}/v1/audit", timeout=30)
    assert keyless.status_code == 401, keyless.text
    assert keyless.json()["error"]["code"] == "missing_api_key"
    wrong = s.call("pft_nope.wrong", "GET", "/v1/audit")
    assert wrong.status_code == 401, wrong.text
    assert wrong.json()["error"]["code"] == "invalid_api_key"
