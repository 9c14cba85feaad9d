"""A canary is judged by its requests' outcomes: the gateway counts each adapter request,
when it ends, by the serving policy's variant that chose its version (outcome, output
tokens, time to first token). The real registry app writes a canary policy into a real
Redis, the gateway's real registry client reads it, fake workers answer over a real
loopback server; which users are in the canary is computed here independently of the code
under test, and the expected token counts are read from the answers the clients got."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from preft_serve.common.objectstore import ObjectStoreSettings
from preft_serve.gateway.app import create_app as create_gateway
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.registry.app import create_app as create_registry
from preft_serve.registry.settings import RegistrySettings
from preft_serve.toymodels import make_model
from tests.gateway.test_disconnect import EndlessStream, SilentStream
from tests.gateway.test_handoff import DECODE, PREFILL, TwoPools
from tests.gateway.test_responses import ResponsesWorker
from tests.registry import factories
from tests.support.canary_split import in_canary as _in_canary
from tests.support.gateway import MSGS, Workers
from tests.support.inprocess import serving
from tests.support.leaving_client import leave_after_headers

ADMIN = "variant-admin-0123456789abcdef"
USERS = [f"user-{i}" for i in range(24)]
WEIGHT = 0.5
OUTCOMES = "preft_gateway_adapter_variant_outcomes_total"
TOKENS = "preft_gateway_adapter_variant_output_tokens_total"
TTFT = "preft_gateway_adapter_variant_ttft_seconds_count"
PICKS = "preft_gateway_adapter_variant_requests_total"
FAMILIES = (OUTCOMES, TOKENS, TTFT, PICKS)
Transport = Callable[[httpx.Request], httpx.Response]


CANARY = [u for u in USERS if _in_canary("bot", u, WEIGHT)]
SERVING = [u for u in USERS if u not in CANARY]


def _variant(user: str) -> str:
    return "canary" if user in CANARY else "serving"


@dataclass
class Stack:
    gateway: httpx.Client
    key: str
    url: str


def canary_tenant(registry: TestClient, model: Path, tmp_path: Path, admin: str) -> dict[str, str]:
    """Tenant 'acme' with adapter 'bot': version 1 serving, version 2 the canary at WEIGHT,
    every user of USERS bound; the tenant's auth header."""
    made = registry.post(
        "/v1/tenants", json={"name": "acme"}, headers={"Authorization": f"Bearer {admin}"}
    )
    auth = {"Authorization": f"Bearer {made.json()['api_key']}"}
    for seed, promote in ((1, "true"), (2, "false")):
        folder = factories.lora(model, tmp_path / f"lora{seed}", seed=seed)
        resp = registry.put(
            "/v1/adapters/bot",
            params={"promote": promote},
            data={"mode": "prefill"},
            files=_files(folder),
            headers=auth,
        )
        assert resp.status_code == 201, resp.text
    policy = {"version": 1, "canary": {"version": 2, "weight": WEIGHT}}
    resp = registry.put("/v1/adapters/bot/policy", json=policy, headers=auth)
    assert resp.status_code == 200, resp.text
    for user in USERS:
        bound = registry.put(f"/v1/users/{user}", json={"adapter": "bot"}, headers=auth)
        assert bound.status_code == 200, bound.text
    return auth


def _files(folder: Path) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [
        ("files", (p.name, p.read_bytes(), "application/octet-stream"))
        for p in sorted(folder.iterdir())
    ]


@contextmanager
def _stack(
    tmp_path: Path, redis_server: str, transport: Transport, **gateway: Any
) -> Iterator[Stack]:
    """Adapter 'bot' with versions 1 (serving) and 2 (canary at WEIGHT), every user bound
    to it, and a gateway over ``transport``'s workers served on a real socket."""
    model = make_model("tiny-llama", tmp_path / "model")
    namespace = f"vm{uuid.uuid4().hex[:10]}"
    registry_settings = RegistrySettings(
        admin_token=ADMIN,
        redis_url=redis_server,
        namespace=namespace,
        base_model=model,
        object_store=ObjectStoreSettings(url=str(tmp_path / "objects")),
        staging_dir=tmp_path,
    )
    with TestClient(create_registry(registry_settings)) as registry:
        auth = canary_tenant(registry, model, tmp_path, ADMIN)
        settings = GatewaySettings(
            base_model_name="tiny",
            worker_base_model="/models/tiny",
            redis_url=redis_server,
            namespace=namespace,
            **gateway,
        )
        app = create_gateway(settings, transport=httpx.MockTransport(transport))
        with serving(app) as url, httpx.Client(base_url=url, headers=auth, timeout=30) as client:
            yield Stack(client, auth["Authorization"].removeprefix("Bearer "), url)


def _scrape(stack: Stack) -> Counter[tuple[str, str, str]]:
    """The four families' samples for adapter 'bot': (name, variant, outcome or '')."""
    found: Counter[tuple[str, str, str]] = Counter()
    for family in text_string_to_metric_families(stack.gateway.get("/metrics").text):
        for sample in family.samples:
            if sample.name in FAMILIES and sample.labels.get("adapter") == "bot":
                labels = sample.labels
                key = (sample.name, labels["variant"], labels.get("outcome", ""))
                found[key] += sample.value
    return found


def _moved(before: Counter[tuple[str, str, str]], after: Counter[tuple[str, str, str]]) -> dict:
    keys = set(before) | set(after)
    return {k: after[k] - before[k] for k in keys if after[k] != before[k]}


def _sse_usage(text: str) -> dict[str, Any]:
    """The last ``usage`` of a streamed answer (chat chunks or Responses events)."""
    usage: dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            response = event.get("response")
            found = event.get("usage") or (response or {}).get("usage")
            usage = found or usage
    assert usage, text
    return usage


class Expected:
    """What each family should move by, built from the answers the clients got."""

    def __init__(self) -> None:
        self.moves: Counter[tuple[str, str, str]] = Counter()

    def request(self, variant: str, outcome: str, tokens: int = 0, ttft: bool = False) -> None:
        self.moves[(OUTCOMES, variant, outcome)] += 1
        self.moves[(PICKS, variant, "")] += 1
        if outcome == "ok":
            self.moves[(TOKENS, variant, "")] += tokens
        if ttft:
            self.moves[(TTFT, variant, "")] += 1

    def nonzero(self) -> dict[tuple[str, str, str], float]:
        return {k: float(v) for k, v in self.moves.items() if v}


class Worker:
    """Chat answers as vLLM's (``Workers``), Responses as vLLM's, a worker error for the
    users in ``failing``, a stream that never ends for the users in ``endless`` and one
    whose first chunk never comes for those in ``silent``."""

    def __init__(self, failing: dict[str, int], endless: set[str], silent: set[str]) -> None:
        self.chat, self.responses = Workers(), ResponsesWorker()
        self.failing, self.endless, self.silent = failing, endless, silent
        self.streams: list[EndlessStream] = []
        self.silent_streams: list[SilentStream] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return self.chat(request)
        body = json.loads(request.content)
        status = self.failing.get(body.get("user", ""))
        if status is not None:
            error = {"message": "the worker failed", "type": "Error", "code": status}
            return httpx.Response(status, json={"error": error})
        if body.get("user") in self.endless:
            self.streams.append(EndlessStream(totals=True))
            return httpx.Response(
                200, stream=self.streams[-1], headers={"content-type": "text/event-stream"}
            )
        if body.get("user") in self.silent:
            self.silent_streams.append(SilentStream())
            return httpx.Response(
                200, stream=self.silent_streams[-1], headers={"content-type": "text/event-stream"}
            )
        if request.url.path == "/v1/responses":
            return self.responses(request)
        return self.chat(request)


def _chat(stack: Stack, user: str, stream: bool, **extra: Any) -> httpx.Response:
    body: dict[str, Any] = {"messages": MSGS, "user": user, "stream": stream, **extra}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return stack.gateway.post("/v1/chat/completions", json=body)


def _tokens(resp: httpx.Response, stream: bool) -> int:
    usage = _sse_usage(resp.text) if stream else resp.json()["usage"]
    return int(usage.get("completion_tokens", usage.get("output_tokens", 0)))


def _wait_for(stack: Stack, key: tuple[str, str, str], value: float) -> None:
    deadline = time.monotonic() + 30
    while _scrape(stack)[key] < value:
        assert time.monotonic() < deadline, f"{key} did not reach {value}"
        time.sleep(0.05)


def test_each_variant_counts_its_outcomes_tokens_and_ttft(
    tmp_path: Path, redis_server: str
) -> None:
    assert len(CANARY) >= 3 and len(SERVING) >= 4  # both sides are exercised
    failing = {CANARY[0]: 500, SERVING[0]: 400}
    worker = Worker(failing, endless={CANARY[1]}, silent={SERVING[2]})
    expected = Expected()
    with _stack(tmp_path, redis_server, worker, worker_urls=["http://w1:8000"]) as stack:
        before = _scrape(stack)
        for user in USERS:
            if user in failing or user in worker.endless | worker.silent:
                continue
            for stream in (False, True):
                resp = _chat(stack, user, stream)
                assert resp.status_code == 200, resp.text
                version = "2" if user in CANARY else "1"
                assert resp.headers["x-preft-adapter-version"] == version
                expected.request(_variant(user), "ok", _tokens(resp, stream), ttft=stream)
        # The Responses route, whole and streamed, on both sides of the split.
        for user in (CANARY[2], SERVING[3]):
            for stream in (False, True):
                body = {"input": "hello", "user": user, "stream": stream}
                resp = stack.gateway.post("/v1/responses", json=body)
                assert resp.status_code == 200, resp.text
                expected.request(_variant(user), "ok", _tokens(resp, stream), ttft=stream)
        # name@version is pinned, whoever asks.
        resp = _chat(stack, CANARY[2], True, model="bot@1")
        assert resp.headers["x-preft-adapter-version"] == "1"
        expected.request("pinned", "ok", _tokens(resp, True), ttft=True)
        # Workers that fail: a 5xx for a canary user, a 4xx for a serving user.
        for user, status in failing.items():
            for stream in (False, True):
                assert _chat(stack, user, stream).status_code == status
                outcome = "server_error" if status >= 500 else "client_error"
                expected.request(_variant(user), outcome)
        assert _moved(before, _scrape(stack)) == expected.nonzero()

        # A client that leaves a canary stream after its first chunk: counted once, ok,
        # with the output the worker reported up to then.
        before = _scrape(stack)
        with httpx.stream(
            "POST",
            f"{stack.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {stack.key}"},
            json={"messages": MSGS, "user": CANARY[1], "stream": True},
            timeout=30,
        ) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
        _wait_for(stack, (OUTCOMES, "canary", "ok"), before[(OUTCOMES, "canary", "ok")] + 1)
        assert worker.streams[0].closed.wait(30)
        moved = _moved(before, _scrape(stack))
        tokens = moved.pop((TOKENS, "canary", ""))
        assert 1 <= tokens <= worker.streams[0].sent
        assert moved == {
            (OUTCOMES, "canary", "ok"): 1,
            (PICKS, "canary", ""): 1,
            (TTFT, "canary", ""): 1,
        }

        # One that leaves a serving stream before its first chunk: counted once, with no
        # output and no time to first token.
        before = _scrape(stack)
        body = {"messages": MSGS, "user": SERVING[2], "stream": True}
        head = leave_after_headers(stack.url, "/v1/chat/completions", stack.key, body)
        assert head.startswith(b"HTTP/1.1 200"), head
        assert worker.silent_streams[0].closed.wait(30)
        _wait_for(stack, (OUTCOMES, "serving", "ok"), before[(OUTCOMES, "serving", "ok")] + 1)
        moved = _moved(before, _scrape(stack))
        assert moved == {(OUTCOMES, "serving", "ok"): 1, (PICKS, "serving", ""): 1}


class FailingPrefill(TwoPools):
    """Two pools whose prefill worker answers 503 for the users in ``failing``."""

    def __init__(self, failing: set[str]) -> None:
        super().__init__()
        self.failing = failing

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if (
            request.method == "POST"
            and request.url.host == "prefill"
            and json.loads(request.content).get("user") in self.failing
        ):
            return httpx.Response(503, json={"error": {"message": "busy", "code": 503}})
        return super().__call__(request)


def test_the_two_pool_path_counts_by_variant(tmp_path: Path, redis_server: str) -> None:
    pools = FailingPrefill({CANARY[0]})
    expected = Expected()
    settings = {"worker_urls": [PREFILL], "decode_worker_urls": [DECODE], "unhealthy_after": 1}
    with _stack(tmp_path, redis_server, pools, **settings) as stack:
        before = _scrape(stack)
        for user in (CANARY[1], CANARY[2], SERVING[0], SERVING[1]):
            for stream in (False, True):
                resp = _chat(stack, user, stream, max_tokens=3)
                assert resp.status_code == 200, resp.text
                expected.request(_variant(user), "ok", _tokens(resp, stream), ttft=stream)
        assert _chat(stack, CANARY[0], False, max_tokens=3).status_code == 503
        expected.request("canary", "server_error")
        assert len(pools.decode_seen) == 8  # every answer went through both pools
        assert _moved(before, _scrape(stack)) == expected.nonzero()
