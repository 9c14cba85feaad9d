"""Gateway tests without a network: a fake registry, MockTransport workers, a tenant key."""

from __future__ import annotations

import json
from typing import Any

import httpx

from preft_serve.adapters.format import AdapterMode
from preft_serve.common.registry_client import AdapterRef, KeyOwner

SHA = "ab" * 32
KEY = "pft_good"
OTHER_KEY = "pft_other"
CREATED = 1_700_000_000  # when 'bot' was first uploaded (unix seconds)


class FakeRegistry:
    """Tenant 'acme' (key pft_good) has adapter 'bot'; user u1 is bound to it. Tenant
    'globex' (key pft_other) has adapter 'rival' and user u9 bound to it."""

    def __init__(self) -> None:
        self.ref = AdapterRef(
            "acme",
            "bot",
            1,
            SHA,
            "lora",
            AdapterMode.PREFILL,
            8,
            "m",  # type: ignore[arg-type]
            CREATED,
        )
        self.other = AdapterRef(
            "globex",
            "rival",
            2,
            "cd" * 32,
            "lora",  # type: ignore[arg-type]
            AdapterMode.PREFILL,
            8,
            "m",
            CREATED + 60,
        )

    async def authenticate(self, api_key: str) -> KeyOwner | None:
        return {KEY: KeyOwner("acme", "k1"), OTHER_KEY: KeyOwner("globex", "k2")}.get(api_key)

    async def resolve_user(self, tenant: str, user: str) -> AdapterRef | None:
        return {("acme", "u1"): self.ref, ("globex", "u9"): self.other}.get((tenant, user))

    async def resolve_adapter(self, tenant: str, name: str) -> AdapterRef | None:
        return {("acme", "bot"): self.ref, ("globex", "rival"): self.other}.get((tenant, name))

    async def adapter_names(self, tenant: str, limit: int = 1000) -> list[str]:
        return [r.name for r in await self.adapters(tenant, limit)]

    async def adapters(self, tenant: str, limit: int = 1000) -> list[AdapterRef]:
        return [r for r in (self.ref, self.other) if r.tenant == tenant][:limit]

    def cache_sizes(self) -> dict[str, int]:
        return {}

    async def aclose(self) -> None:
        pass


class Workers:
    """Records what the worker saw; answers like vLLM would."""

    def __init__(self, max_model_len: int | None = None) -> None:
        self.seen: list[dict[str, Any]] = []
        self.headers: list[httpx.Headers] = []  # of each completion request, like seen
        self.max_model_len = max_model_len  # listed in /v1/models when set, as vLLM does

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # the gateway's health and residency checks
            data = (
                []
                if self.max_model_len is None
                else [
                    {"id": "/models/tiny", "object": "model", "max_model_len": self.max_model_len}
                ]
            )
            return httpx.Response(200, json={"object": "list", "data": data})
        body = json.loads(request.content)
        self.seen.append(body)
        self.headers.append(request.headers)
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        if body.get("stream"):
            chunks = [
                {"model": body["model"], "choices": [{"delta": {"content": c}}]} for c in ("a", "b")
            ]
            chunks.append({"model": body["model"], "choices": [], "usage": usage})
            text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})
        return httpx.Response(
            200,
            json={
                "model": body["model"],
                "usage": usage,
                "choices": [{"message": {"content": "hi"}}],
            },
        )


AUTH = {"Authorization": f"Bearer {KEY}"}
MSGS = [{"role": "user", "content": "hello"}]


def message(resp: Any) -> str:
    return str(resp.json()["error"]["message"])


# The rate limiter lets requests through when Redis answers slower than its timeout (0.2 s
# by default, for production): on a loaded test machine that reads as a missing 429. Tests
# of the limits' semantics wait this long instead.
PATIENT_LIMITER_S = 5.0  # the most the setting allows
