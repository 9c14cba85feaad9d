"""Clients that leave, on a tenant of their own, to check that every token a worker
computed is billed however the client goes: streamed chat completions and ``/v1/responses``
whose client hangs up right after the answer's headers, or mid-stream after a few tokens.
Their tenant sends nothing else but the probes below, so its usage (``GET /v1/usage``) must
add up to at least their requests, their prompts' tokens and the tokens they saw.

The same tenant sends, every minute, requests with a field no worker honours here:
``tools`` or ``tool_choice`` (the workers run without a tool-call parser) and the workers'
internal ``kv_transfer_params``, top-level or in ``vllm_xargs``. Each must be refused with
a 400 and its code (``tool_calling_disabled``, ``unsupported_parameter``), never answered
as if the field were absent.

Records: ``journal.leaving`` ``{"k": "leave", "api": "chat"|"responses", "mode":
"headers"|"midstream", "t0", "t1", "status", "prompt": i, "prompt_tokens", "deltas",
"ended"}``, and for a refusal ``"shape_ok", "msg"`` (``deltas``: text deltas read before
leaving; ``ended``: the stream finished before the client left); ``journal.probes``
``{"k": "unsupported", "field", "path", "expected_code", "t0", "t1", "status", "code",
"param", "msg", "shape_ok"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import re
import threading
from typing import Any

import httpx

from bench.soak.journal import Journal, say
from bench.soak.verify import error_shape_ok

PROMPTS = (
    "Tell me about the harbour at night.",
    "Seven wizards quietly judge boxing matches near the old harbour; why?",
    "Describe a lazy dog in three long sentences, then a quick brown fox in two.",
    "What would a fox say to a dog that jumps over it every morning?",
)
MAX_TOKENS = 48
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}
UNSUPPORTED: tuple[tuple[str, str, dict[str, Any], str], ...] = (
    # (path, field, what the request adds, the error code its 400 must carry)
    ("/v1/responses", "tools", {"tools": [TOOL]}, "tool_calling_disabled"),
    ("/v1/responses", "tool_choice", {"tool_choice": "required"}, "tool_calling_disabled"),
    ("/v1/chat/completions", "tools", {"tools": [CHAT_TOOL]}, "tool_calling_disabled"),
    (
        "/v1/chat/completions",
        "kv_transfer_params",
        {"kv_transfer_params": {"do_remote_prefill": True}},
        "unsupported_parameter",
    ),
    (
        "/v1/chat/completions",
        "vllm_xargs.kv_transfer_params",
        {"vllm_xargs": {"kv_transfer_params": {"do_remote_prefill": True}}},
        "unsupported_parameter",
    ),
)


ERROR_BODY_MAX = 64 * 1024


def error_fields(raw: bytes) -> dict[str, Any]:
    """What the errors check reads of a refusal: its envelope's shape and message (the
    message names the worker a 502 came from, which decides the fault that accounts for it)."""
    fields: dict[str, Any] = {"shape_ok": False}
    with contextlib.suppress(ValueError, TypeError, KeyError):
        payload = json.loads(raw)
        fields["shape_ok"] = error_shape_ok(payload)
        fields["msg"] = str(payload["error"]["message"])[:200]
    return fields


def body(api: str, model: str, prompt: str, stream: bool, tokens: int) -> dict[str, Any]:
    if api == "chat":
        return {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": stream,
        }
    return {
        "model": model,
        "input": [{"role": "user", "content": prompt}],
        "max_output_tokens": tokens,
        "temperature": 0,
        "stream": stream,
    }


PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}


def prompt_tokens(gateway: str, api_key: str, model: str) -> dict[str, list[int]]:
    """Each prompt's tokens as the API itself reports them (a 1-token answer's usage), per
    API; an API that does not answer is left out (and its clients with it)."""
    out: dict[str, list[int]] = {}
    with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {api_key}"}) as http:
        for api, path in PATHS.items():
            counts = []
            for prompt in PROMPTS:
                reply = http.post(f"{gateway}{path}", json=body(api, model, prompt, False, 1))
                if reply.status_code != 200:
                    say(
                        f"  {path} answered {reply.status_code} to a plain request: "
                        f"{reply.text[:200]}; no clients leave it"
                    )
                    break
                usage = reply.json()["usage"]
                counts.append(int(usage["prompt_tokens" if api == "chat" else "input_tokens"]))
            else:
                out[api] = counts
    return out


def usage_totals(registry: str, api_key: str) -> dict[str, int]:
    """The tenant's billed requests and tokens, all days and models together."""
    reply = httpx.get(
        f"{registry}/v1/usage", timeout=30, headers={"Authorization": f"Bearer {api_key}"}
    )
    reply.raise_for_status()
    totals = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
    for day in reply.json()["days"]:
        for model in day["models"]:
            for field in totals:
                totals[field] += int(model.get(field) or 0)
    return totals


class Leaving:
    """The leaving tenant's clients, one request every ``1 / rate`` s on average."""

    def __init__(
        self,
        gateway: str,
        api_key: str,
        model: str,
        tokens: dict[str, list[int]],
        journal: Journal,
        rng: random.Random,
        rate: float = 0.5,
        probe_every_s: float = 60.0,
    ) -> None:
        self.gateway, self.api_key, self.model = gateway, api_key, model
        self.tokens, self.journal, self.rng, self.rate = tokens, journal, rng, rate
        self.probe_every_s = probe_every_s
        url = httpx.URL(gateway)
        self.host, self.port = url.host, url.port or 80

    def run(self, stop: threading.Event) -> None:
        asyncio.run(self._run(stop))

    async def _run(self, stop: threading.Event) -> None:
        tasks: set[asyncio.Task[None]] = set()
        next_probe = 0.0
        turns = itertools.cycle(
            [(api, mode) for api in sorted(self.tokens) for mode in ("headers", "midstream")]
        )
        async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=10)) as http:
            while not stop.is_set():
                if self.journal.now() >= next_probe:
                    next_probe = self.journal.now() + self.probe_every_s
                    for path, field, extra, code in UNSUPPORTED:
                        self._spawn(tasks, self._unsupported(http, path, field, extra, code))
                if self.tokens:  # each API and way of leaving in turn: all are seen
                    api, mode = next(turns)
                    self._spawn(
                        tasks, self._leave(http, api, mode, self.rng.randrange(len(PROMPTS)))
                    )
                await asyncio.sleep(self.rng.expovariate(self.rate))
            if tasks:
                await asyncio.wait(tasks, timeout=150)

    @staticmethod
    def _spawn(tasks: set[asyncio.Task[None]], coro: Any) -> None:
        task = asyncio.create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _leave(self, http: httpx.AsyncClient, api: str, mode: str, i: int) -> None:
        rec: dict[str, Any] = {
            "k": "leave",
            "api": api,
            "mode": mode,
            "prompt": i,
            "prompt_tokens": self.tokens[api][i],
            "t0": self.journal.now(),
            "status": 0,
            "err": None,
            "deltas": 0,
            "ended": False,
        }
        payload = body(api, self.model, PROMPTS[i], True, MAX_TOKENS)
        try:
            if mode == "headers":
                await self._leave_after_headers(PATHS[api], payload, rec)
            else:
                await self._leave_midstream(http, PATHS[api], payload, rec)
        except (OSError, TimeoutError, httpx.HTTPError) as exc:
            rec["err"] = type(exc).__name__
        rec["t1"] = self.journal.now()
        self.journal.add("leaving", rec)

    async def _leave_after_headers(
        self, path: str, payload: dict[str, Any], rec: dict[str, Any]
    ) -> None:
        """A raw socket: send the request, read the answer's head, hang up."""
        data = json.dumps(payload).encode()
        reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 10)
        try:
            writer.write(
                (
                    f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                    f"Authorization: Bearer {self.api_key}\r\n"
                    "Content-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n"
                ).encode()
                + data
            )
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 120)
            rec["status"] = int(head.split(b"\r\n", 1)[0].split()[1])
            if rec["status"] != 200:  # an error is read whole: its envelope is checked
                length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                size = min(int(length.group(1)), ERROR_BODY_MAX) if length else ERROR_BODY_MAX
                with contextlib.suppress(asyncio.IncompleteReadError, TimeoutError):
                    rec.update(error_fields(await asyncio.wait_for(reader.readexactly(size), 30)))
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _leave_midstream(
        self, http: httpx.AsyncClient, path: str, payload: dict[str, Any], rec: dict[str, Any]
    ) -> None:
        """Read 2-6 text deltas, then close the stream (httpx drops the connection)."""
        leave_after = self.rng.randint(2, 6)
        async with http.stream(
            "POST",
            f"{self.gateway}{path}",
            json=payload,
            headers={"Authorization": f"Bearer {self.api_key}"},
        ) as reply:
            rec["status"] = reply.status_code
            if reply.status_code != 200:
                rec.update(error_fields(await reply.aread()))
                return
            async for line in reply.aiter_lines():
                if line.strip() == "data: [DONE]" or '"response.completed"' in line:
                    rec["ended"] = True
                    break
                if line.startswith("data: ") and _is_delta(line[6:]):
                    rec["deltas"] += 1
                    if rec["deltas"] >= leave_after:
                        break
            else:
                rec["ended"] = True

    async def _unsupported(
        self, http: httpx.AsyncClient, path: str, field: str, extra: dict[str, Any], code: str
    ) -> None:
        api = "chat" if path == PATHS["chat"] else "responses"
        rec: dict[str, Any] = {
            "k": "unsupported",
            "path": path,
            "field": field,
            "expected_code": code,
            "t0": self.journal.now(),
            "status": 0,
            "err": None,
        }
        try:
            reply = await http.post(
                f"{self.gateway}{path}",
                headers={"Authorization": f"Bearer {self.api_key}"},
                json={**body(api, self.model, PROMPTS[0], False, 4), **extra},
            )
            rec["status"] = reply.status_code
            payload: Any = None
            with contextlib.suppress(ValueError):
                payload = reply.json()
            if reply.status_code != 200:
                rec["shape_ok"] = error_shape_ok(payload)
                with contextlib.suppress(TypeError, KeyError):
                    rec["code"] = payload["error"]["code"]
                    rec["msg"] = str(payload["error"]["message"])[:300]
                    rec["param"] = payload["error"]["param"]
        except httpx.HTTPError as exc:
            rec["err"] = type(exc).__name__
        rec["t1"] = self.journal.now()
        self.journal.add("probes", rec)


def _is_delta(data: str) -> bool:
    """A chat chunk with text, or a Responses ``response.output_text.delta`` event."""
    with contextlib.suppress(ValueError):
        event = json.loads(data)
        if event.get("type") == "response.output_text.delta":
            return bool(event.get("delta"))
        for choice in event.get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                return True
    return False
