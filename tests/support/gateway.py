"""Gateway tests without a network: a fake registry, MockTransport workers, a tenant key."""

from __future__ import annotations

import json
from typing import Any

import httpx
from preft_serve.common.adapter_format import AdapterMode
from preft_serve.common.registry_client import AdapterRef, KeyOwner

SHA = "ab" * 32
KEY = "pft_good"


class FakeRegistry:
    """Tenant 'acme' (key pft_good) has adapter 'bot'; user u1 is bound to it."""

    def __init__(self) -> None:
        self.ref = AdapterRef("acme", "bot", 1, SHA, "lora", AdapterMode.PREFILL, 8, "m")  # type: ignore[arg-type]

    async def authenticate(self, api_key: str) -> KeyOwner | None:
        return KeyOwner("acme", "k1") if api_key == KEY else None

    async def resolve_user(self, tenant: str, user: str) -> AdapterRef | None:
        return self.ref if (tenant, user) == ("acme", "u1") else None

    async def resolve_adapter(self, tenant: str, name: str) -> AdapterRef | None:
        return self.ref if (tenant, name) == ("acme", "bot") else None

    async def adapter_names(self, tenant: str, limit: int = 1000) -> list[str]:
        return ["bot"][:limit] if tenant == "acme" else []

    def cache_sizes(self) -> dict[str, int]:
        return {}

    async def aclose(self) -> None:
        pass


class Workers:
    """Records what the worker saw; answers like vLLM would."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # the gateway's health and residency checks
            return httpx.Response(200, json={"object": "list", "data": []})
        body = json.loads(request.content)
        self.seen.append(body)
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        if body.get("stream"):
            chunks = [{"model": body["model"], "choices": [{"delta": {"content": c}}]}
                      for c in ("a", "b")]
            chunks.append({"model": body["model"], "choices": [], "usage": usage})
            text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json={"model": body["model"], "usage": usage,
                                         "choices": [{"message": {"content": "hi"}}]})


AUTH = {"Authorization": f"Bearer {KEY}"}
MSGS = [{"role": "user", "content": "hello"}]


def message(resp: Any) -> str:
    return str(resp.json()["error"]["message"])
