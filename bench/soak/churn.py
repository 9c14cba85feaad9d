"""Tenant changes while the soak runs: uploads, hot swaps, rebinds and deletes."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.soak.journal import Journal
from bench.soak.verify import error_shape_ok, ok
from preft_serve.adapters.format import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    canonical_config_bytes,
    file_digest,
    read_config,
)


def _body(reply: httpx.Response) -> Any:
    try:
        return reply.json()
    except ValueError:
        return None


class Tenants:
    """The tenants' side: seeded adapters, fresh content for uploads and new versions."""

    def __init__(
        self, registry: str, keys: list[str], seeded: list[dict[str, Any]], pool: list[Path]
    ) -> None:
        self.registry, self.keys = registry, keys
        self.seeded = seeded
        self.pool = pool
        self.lock = threading.Lock()
        self.bound_names = {
            t: [s["name"] for s in seeded if s["tenant"] == t] for t in range(len(keys))
        }
        self.users = {t: [s["user"] for s in seeded if s["tenant"] == t] for t in range(len(keys))}
        self.unbound: dict[int, list[str]] = {t: [] for t in range(len(keys))}
        self.seq = 0

    def fresh(self) -> Path | None:
        with self.lock:
            return self.pool.pop() if self.pool else None

    def headers(self, tenant: int) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    def upload(
        self,
        tenant: int,
        name: str,
        folder: Path,
        journal: Journal,
        new_version: bool = False,
        body: Callable[[bytes], Any] | None = None,
    ) -> dict[str, Any]:
        """POST (or PUT: a hot swap) ``folder`` as ``name``; the record has the sha256
        computed here, so the checks compare it with what the store holds."""
        config = canonical_config_bytes(read_config(folder))
        sha = file_digest(config, folder / WEIGHTS_FILE)
        files = [
            ("files", (n, (folder / n).read_bytes(), "application/octet-stream"))
            for n in (CONFIG_FILE, WEIGHTS_FILE)
        ]
        method, url = (
            ("PUT", f"{self.registry}/v1/adapters/{name}?promote=true")
            if new_version
            else ("POST", f"{self.registry}/v1/adapters")
        )
        data = {"mode": "prefill"} if new_version else {"name": name, "mode": "prefill"}
        request = httpx.Request(method, url, data=data, files=files, headers=self.headers(tenant))
        content = request.read()
        rec: dict[str, Any] = {
            "k": "swap" if new_version else "upload",
            "tenant": tenant,
            "name": name,
            "sha": sha,
            "status": 0,
            "t0": journal.now(),
        }
        try:
            reply = httpx.request(
                method,
                url,
                headers=dict(request.headers),
                timeout=60,
                content=body(content) if body else content,
            )
            rec["status"] = reply.status_code
            payload = _body(reply)
            if reply.status_code == 201 and isinstance(payload, dict):
                rec["version"], rec["sha_reply"] = payload["version"], payload["sha256"]
            else:
                rec["shape_ok"] = error_shape_ok(payload)
        except httpx.HTTPError as exc:
            rec["err_detail"] = type(exc).__name__
        rec["t1"] = journal.now()
        journal.add("mutations", rec)
        return rec

    def call(
        self, kind: str, tenant: int, method: str, path: str, journal: Journal, **fields: Any
    ) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "k": kind,
            "tenant": tenant,
            "status": 0,
            "t0": journal.now(),
            **fields,
        }
        body = {"adapter": fields["name"]} if kind == "bind" else None
        try:
            reply = httpx.request(
                method,
                f"{self.registry}{path}",
                json=body,
                timeout=30,
                headers=self.headers(tenant),
            )
            rec["status"] = reply.status_code
            if not ok(reply.status_code):
                rec["shape_ok"] = error_shape_ok(_body(reply))
        except httpx.HTTPError as exc:
            rec["err_detail"] = type(exc).__name__
        rec["t1"] = journal.now()
        journal.add("mutations", rec)
        return rec

    def change(self, tenant: int, rng: random.Random, journal: Journal) -> None:
        """One random change: upload 35%, hot swap 30%, rebind 20%, delete 15%."""
        roll = rng.random()
        with self.lock:
            self.seq += 1
            seq = self.seq
        if roll < 0.35 or (roll >= 0.85 and not self.unbound[tenant]):
            if (folder := self.fresh()) is not None:
                name = f"n{tenant}-{seq:05d}"
                if ok(self.upload(tenant, name, folder, journal)["status"]):
                    self.unbound[tenant].append(name)
        elif roll < 0.65:
            if (folder := self.fresh()) is not None:
                self.upload(
                    tenant, rng.choice(self.bound_names[tenant]), folder, journal, new_version=True
                )
        elif roll < 0.85:
            user = rng.choice(self.users[tenant])
            if self.unbound[tenant] and rng.random() < 0.5:
                name = self.unbound[tenant].pop(rng.randrange(len(self.unbound[tenant])))
                self.bound_names[tenant].append(name)  # never deleted from now on
            else:
                name = rng.choice(self.bound_names[tenant])
            self.call("bind", tenant, "PUT", f"/v1/users/{user}", journal, user=user, name=name)
        else:
            name = self.unbound[tenant].pop(0)
            self.call("delete", tenant, "DELETE", f"/v1/adapters/{name}", journal, name=name)


def change_loop(
    tenants: Tenants,
    tenant: int,
    interval: float,
    stop: threading.Event,
    seed: int,
    journal: Journal,
) -> None:
    rng = random.Random(seed)
    while not stop.wait(rng.uniform(0.5, 1.5) * interval):
        tenants.change(tenant, rng, journal)
