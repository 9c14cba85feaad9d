"""Chat completions for random bound users: a closed loop to measure capacity, then an
open loop (Poisson arrivals) at a share of it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import threading
import time
from typing import Any

import httpx

from bench.soak.journal import Journal
from bench.soak.verify import error_shape_ok, ok

WORDS = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "seven",
    "wizards",
    "quietly",
    "judge",
    "boxing",
    "matches",
    "near",
    "old",
    "harbour",
)


@dataclasses.dataclass(frozen=True)
class Client:
    tenant: int
    api_key: str
    user: str


async def one_request(
    http: httpx.AsyncClient,
    gateway: str,
    c: Client,
    rng: random.Random,
    journal: Journal,
    sink: list[dict[str, Any]],
) -> None:
    stream = rng.random() < 0.3
    body: dict[str, Any] = {
        "user": c.user,
        "temperature": 0,
        "ignore_eos": True,
        "max_tokens": rng.randint(4, 16),
        "messages": [
            {
                "role": "user",
                "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24))),
            }
        ],
    }
    if stream:
        body["stream"] = True
    rec: dict[str, Any] = {
        "k": "chat",
        "t0": journal.now(),
        "tenant": c.tenant,
        "user": c.user,
        "status": 0,
        "err": None,
        "shape_ok": None,
        "stream": stream,
    }
    try:
        async with http.stream(
            "POST",
            f"{gateway}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {c.api_key}"},
        ) as reply:
            rec["status"] = reply.status_code
            rec["name"] = reply.headers.get("x-preft-adapter")
            version = reply.headers.get("x-preft-adapter-version")
            rec["version"] = int(version) if version else None
            rec["sha"] = reply.headers.get("x-preft-adapter-sha256")
            raw = await reply.aread()
            if reply.status_code != 200:
                with contextlib.suppress(ValueError):
                    payload = json.loads(raw)
                    rec["shape_ok"] = error_shape_ok(payload)
                    rec["msg"] = str(payload["error"]["message"])[:200]
                rec["shape_ok"] = bool(rec["shape_ok"])
            elif stream:
                if b'"error"' in raw or b"data: [DONE]" not in raw:
                    rec["err"] = "broken_stream"
                    rec["msg"] = raw[-200:].decode(errors="replace")
            elif not (json.loads(raw).get("choices")):
                rec["err"] = "no_choices"
    except Exception as exc:  # noqa: BLE001 (a broken answer is a result, not a crash)
        rec["err"] = type(exc).__name__
    rec["t1"] = journal.now()
    sink.append(rec)


async def _closed_loop(
    gateway: str,
    clients: list[Client],
    seconds: float,
    concurrency: int,
    journal: Journal,
    sink: list[dict[str, Any]],
) -> None:
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(
        timeout=120, limits=httpx.Limits(max_connections=concurrency)
    ) as http:

        async def loop(i: int) -> None:
            rng = random.Random(i)
            while time.monotonic() < end:
                await one_request(http, gateway, rng.choice(clients), rng, journal, sink)

        await asyncio.gather(*(loop(i) for i in range(concurrency)))


def measure_capacity(gateway: str, clients: list[Client], seconds: float) -> float:
    """Successful requests/s with 24 clients sending back to back (after a 5 s warm-up)."""
    journal = Journal()
    warm: list[dict[str, Any]] = []
    asyncio.run(_closed_loop(gateway, clients, 5, 24, journal, warm))
    done: list[dict[str, Any]] = []
    start = journal.now()
    asyncio.run(_closed_loop(gateway, clients, seconds, 24, journal, done))
    span = journal.now() - start
    good = sum(1 for r in done if ok(r["status"]) and not r["err"])
    return good / span


async def open_loop(
    gateway: str,
    clients: list[Client],
    rate: float,
    stop: threading.Event,
    rng: random.Random,
    journal: Journal,
    max_inflight: int = 96,
) -> None:
    sink: list[dict[str, Any]] = []
    tasks: set[asyncio.Task[None]] = set()
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(120, connect=10), limits=httpx.Limits(max_connections=max_inflight)
    ) as http:
        due = time.monotonic()
        while not stop.is_set():
            due += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if len(tasks) >= max_inflight:
                journal.shed += 1  # the client's own cap, not the service's refusal
                continue
            task = asyncio.create_task(
                one_request(
                    http, gateway, rng.choice(clients), random.Random(rng.random()), journal, sink
                )
            )
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            while sink:
                journal.add("requests", sink.pop())
        if tasks:
            await asyncio.wait(tasks, timeout=150)
        for rec in sink:
            journal.add("requests", rec)
