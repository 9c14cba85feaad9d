"""Nothing lost: what the registry and the store hold at the end, read back against what
they acknowledged during the soak."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.soak.churn import Tenants
from bench.soak.journal import Journal
from bench.soak.processes import Stack
from bench.soak.verify import ok


def verify_state(stack: Stack, tenants: Tenants, journal: Journal) -> dict[str, Any]:
    """Nothing lost: acknowledged uploads listed and downloadable with the sha256 sent,
    acknowledged bindings resolve, no blob referenced but missing, deletes stay deleted."""
    registry, store = stack.urls["registry"], stack.store()
    http = httpx.Client(timeout=30)
    muts = sorted(journal.mutations, key=lambda m: m["t1"])
    deleted = {(m["tenant"], m["name"]) for m in muts if m["k"] == "delete" and ok(m["status"])}
    expected: dict[tuple[int, str], dict[int, str]] = {}
    for s in tenants.seeded:
        expected.setdefault((s["tenant"], s["name"]), {})[1] = s["sha"]
    sha_mismatch = 0
    for m in muts:
        if m["k"] in ("upload", "swap") and m["status"] == 201:
            expected.setdefault((m["tenant"], m["name"]), {})[m["version"]] = m["sha"]
            sha_mismatch += m["sha_reply"] != m["sha"]
    binds: dict[tuple[int, str], str] = {
        (s["tenant"], s["user"]): s["name"] for s in tenants.seeded
    }
    unknown_binds = {
        (m["tenant"], m["user"])
        for m in muts
        if m["k"] == "bind" and not ok(m["status"]) and not 400 <= m["status"] < 500
    }
    for m in muts:
        if m["k"] == "bind" and ok(m["status"]):
            binds[(m["tenant"], m["user"])] = m["name"]
    out: dict[str, Any] = {
        "uploads_acknowledged": sum(len(v) for v in expected.values()),
        "sha_reply_mismatch": sha_mismatch,
        "not_listed": [],
        "not_downloadable": [],
        "deleted_but_listed": [],
        "bindings_checked": len(binds),
        "bindings_wrong": [],
        "blobs_referenced": 0,
        "blobs_missing": [],
    }
    for (tenant, name), versions in expected.items():
        reply = http.get(f"{registry}/v1/adapters/{name}", headers=tenants.headers(tenant))
        if (tenant, name) in deleted:
            if reply.status_code != 404:
                out["deleted_but_listed"].append([tenant, name, reply.status_code])
            continue
        listed = (
            {v["version"]: v["sha256"] for v in reply.json()["versions"]}
            if reply.status_code == 200
            else {}
        )
        for version, sha in versions.items():
            if listed.get(version) != sha:
                out["not_listed"].append([tenant, name, version, reply.status_code])
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    store.fetch_adapter(sha, Path(tmp), verify=True)
                except Exception as exc:  # noqa: BLE001 (reported, not raised)
                    out["not_downloadable"].append([sha, type(exc).__name__])
    for (tenant, user), name in binds.items():
        reply = http.get(f"{registry}/v1/users/{user}", headers=tenants.headers(tenant))
        got = reply.json().get("adapter") if reply.status_code == 200 else None
        if got != name and (tenant, user) not in unknown_binds:
            out["bindings_wrong"].append([tenant, user, name, got])
    for tenant in range(len(tenants.keys)):  # every version the registry lists
        cursor: str | None = None
        while True:
            page = http.get(
                f"{registry}/v1/adapters",
                headers=tenants.headers(tenant),
                params={"limit": 1000, **({"cursor": cursor} if cursor else {})},
            )
            page.raise_for_status()
            for item in page.json()["items"]:
                detail = http.get(
                    f"{registry}/v1/adapters/{item['name']}", headers=tenants.headers(tenant)
                ).json()
                for v in detail["versions"]:
                    out["blobs_referenced"] += 1
                    if not store.has_adapter(v["sha256"]):
                        out["blobs_missing"].append(v["sha256"])
            cursor = page.json()["next_cursor"]
            if not cursor:
                break
    http.close()
    out["lost"] = (
        len(out["not_listed"])
        + len(out["not_downloadable"])
        + len(out["bindings_wrong"])
        + len(out["blobs_missing"])
        + out["sha_reply_mismatch"]
    )
    return out
