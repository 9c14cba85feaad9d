"""One hostile tenant, for the whole soak: slow uploads and huge ``/tokenize`` calls through
the gateway, to check that a tenant over its bound is refused (429, or 413 for an oversize
body, naming its own limit) while the other tenants are served as before.

* Slow uploads: ``slots`` connections at once each open ``POST /v1/files``, send the
  headers (a ``Content-Length`` of 1 MiB) and the first ~200 bytes of a multipart body,
  then stall until the gateway answers or closes, or ``hold_s`` passes; then again,
  ``PAUSE_S`` later. Each stalled body would hold one of the gateway's connections to the
  registry (100 in all) for as long as the client likes.
* Huge tokenize calls: ``tokenizers`` clients send ~1 MB ``/tokenize`` bodies (a prompt of
  ~200,000 tokens) back to back, never waiting for a ``Retry-After``.

Every answer is a record in ``journal.hostile``
(``{"k": "slow_upload"|"tokenize", "t0", "t1", "status", "code", "msg", "shape_ok"}``;
``status`` 0: no answer, ``err`` says why)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any

import httpx

from bench.soak.journal import Journal
from bench.soak.verify import error_shape_ok

BOUNDARY = "soak-hostile-boundary"
# The first ~200 bytes of a training-file upload; the rest never comes.
SLOW_HEAD = (
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n'
    f'fine-tune\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
    'filename="slow.jsonl"\r\nContent-Type: application/jsonl\r\n\r\n'
    '{"messages": [{"role": "user", "content": "'
).encode()
SLOW_CLAIMED_BYTES = 1 << 20
PAUSE_S = 4.0
"""A slot's pause between uploads: refused at once, 128 slots send ~30 uploads/s, which
is what the gateway must refuse cheaply; stalled, more than 100 are held at any time."""
TOKENIZE_BYTES = 1_000_000  # under the gateway's 1 MiB request-body limit


def _answer(raw: bytes) -> dict[str, Any]:
    """Status, error code and message of a raw HTTP answer (head and whatever body came)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    out: dict[str, Any] = {"status": 0}
    with contextlib.suppress(IndexError, ValueError):
        out["status"] = int(head.split(b"\r\n", 1)[0].split()[1])
    if b"\r\ntransfer-encoding: chunked" in head.lower():  # one chunk holds the envelope
        body = body.partition(b"\r\n")[2]
    with contextlib.suppress(ValueError):
        payload = json.loads(body[: body.rfind(b"}") + 1] or b"null")
        out.update(_error_fields(payload))
    if out["status"] and "shape_ok" not in out:
        out["shape_ok"] = False
    return out


def _error_fields(payload: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"shape_ok": error_shape_ok(payload)}
    with contextlib.suppress(TypeError, KeyError):
        fields["code"] = payload["error"]["code"]
        fields["msg"] = str(payload["error"]["message"])[:300]
    return fields


class Hostile:
    """The hostile tenant's clients; :meth:`run` drives them until ``stop`` is set."""

    def __init__(
        self,
        gateway: str,
        api_key: str,
        base_model: str,
        journal: Journal,
        slots: int = 128,
        hold_s: float = 40.0,
        tokenizers: int = 2,
    ) -> None:
        self.gateway, self.api_key, self.base_model = gateway, api_key, base_model
        self.journal, self.slots, self.hold_s, self.tokenizers = (
            journal,
            slots,
            hold_s,
            tokenizers,
        )
        url = httpx.URL(gateway)
        self.host, self.port = url.host, url.port or 80

    def run(self, stop: threading.Event) -> None:
        asyncio.run(self._run(stop))

    async def _run(self, stop: threading.Event) -> None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=10)) as http:
            tasks = [asyncio.create_task(self._slow_uploads(stop, i)) for i in range(self.slots)]
            tasks += [
                asyncio.create_task(self._tokenize(http, stop)) for _ in range(self.tokenizers)
            ]
            await asyncio.to_thread(stop.wait)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _slow_uploads(self, stop: threading.Event, slot: int) -> None:
        await asyncio.sleep(slot * 0.02)  # not all in the same millisecond
        while not stop.is_set():
            await self._slow_upload()
            await asyncio.sleep(PAUSE_S)  # then again, from the same slot

    async def _slow_upload(self) -> None:
        rec: dict[str, Any] = {
            "k": "slow_upload",
            "t0": self.journal.now(),
            "status": 0,
            "err": None,
        }
        writer = None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), 10
            )
            writer.write(
                (
                    f"POST /v1/files HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                    f"Authorization: Bearer {self.api_key}\r\n"
                    f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
                    f"Content-Length: {SLOW_CLAIMED_BYTES}\r\n\r\n"
                ).encode()
                + SLOW_HEAD
            )
            await writer.drain()
            raw = b""
            deadline = time.monotonic() + self.hold_s
            while (left := deadline - time.monotonic()) > 0:  # stall: read, never write
                try:
                    chunk = await asyncio.wait_for(
                        reader.read(8192), min(left, 1.0) if raw else left
                    )
                except TimeoutError:
                    if raw:
                        break  # the answer came and nothing more follows
                    continue
                if not chunk:
                    break
                raw += chunk
                if len(raw) > 16384:
                    break
            rec.update(_answer(raw))
            if not raw:
                rec["err"] = "held" if time.monotonic() >= deadline else "closed"
        except (OSError, TimeoutError) as exc:
            rec["err"] = type(exc).__name__
        finally:
            if writer is not None:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
        rec["t1"] = self.journal.now()
        self.journal.add("hostile", rec)

    async def _tokenize(self, http: httpx.AsyncClient, stop: threading.Event) -> None:
        words = TOKENIZE_BYTES // len("hello ")
        body = json.dumps({"model": self.base_model, "prompt": "hello " * words}).encode()
        while not stop.is_set():
            rec: dict[str, Any] = {
                "k": "tokenize",
                "t0": self.journal.now(),
                "status": 0,
                "err": None,
                "bytes": len(body),
            }
            try:
                reply = await http.post(
                    f"{self.gateway}/tokenize",
                    content=body,
                    headers={
                        "Authorization": f"Bearer {self.api_key}",
                        "Content-Type": "application/json",
                    },
                )
                rec["status"] = reply.status_code
                if reply.status_code != 200:
                    payload: Any = None
                    with contextlib.suppress(ValueError):
                        payload = reply.json()
                    rec.update(_error_fields(payload))
            except httpx.HTTPError as exc:
                rec["err"] = type(exc).__name__
            rec["t1"] = self.journal.now()
            self.journal.add("hostile", rec)
            await asyncio.sleep(0.2)
