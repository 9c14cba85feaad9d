"""The demo tenant of ``make run``: its adapters, its users, and the examples printed for it."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import httpx

from preft_serve.adapters.format import AdapterMode
from preft_serve.onebox.processes import StackError
from preft_serve.onebox.seed import TenantSession, Uploaded, create_tenant
from preft_serve.onebox.stack import OneBox
from preft_serve.worker.demo import DEMO_ADAPTERS, DEMO_REFT_ADAPTERS

TENANT = "demo"
# user -> the toy demo adapter (folder name under var/demo/adapters, and its registry name).
TOY_USERS = {
    "alice": "alice-prefill",
    "bob": "bob-prefill",
    "carol": "carol-all",
    "dave": "dave-direft",
    "erin": "erin-loreft",
}
PROMPT = "Hello"
MAX_TOKENS = 32


@dataclasses.dataclass(frozen=True)
class Binding:
    """One demo user and the adapter folder uploaded and bound for them."""

    user: str
    adapter: str  # registry name
    directory: Path
    mode: AdapterMode


def toy_mode(adapter: str) -> AdapterMode:
    """The mode each toy demo adapter was generated for (ReFT is always prefill-only)."""
    if adapter in DEMO_ADAPTERS:
        return DEMO_ADAPTERS[adapter][1]
    if adapter in DEMO_REFT_ADAPTERS:
        return AdapterMode.PREFILL
    raise KeyError(adapter)


def toy_bindings(adapters_dir: Path) -> list[Binding]:
    return [
        Binding(user, name, adapters_dir / name, toy_mode(name)) for user, name in TOY_USERS.items()
    ]


@dataclasses.dataclass
class DemoTenant:
    api_key: str
    bindings: list[Binding]
    adapters: dict[str, Uploaded]  # by name
    sample_data: Path  # a chat JSONL file to show `preft train` on

    @property
    def users(self) -> list[str]:
        return [b.user for b in self.bindings]


def seed_demo(stack: OneBox, bindings: list[Binding], sample_data: Path) -> DemoTenant:
    """Create the demo tenant, upload each binding's adapter, bind its user."""
    api_key = create_tenant(stack.registry_url, stack.admin_token, TENANT)
    session = TenantSession(stack.registry_url, api_key)
    uploaded: dict[str, Uploaded] = {}
    try:
        for b in bindings:
            up = session.upload(b.directory, b.adapter, b.mode)
            session.bind(b.user, b.adapter)
            uploaded[b.adapter] = up
            stack.say(
                f"  {b.user:<6}-> {b.adapter:<14} {up.type:<7} mode {up.mode:<8} "
                f"sha256:{up.sha256[:12]}..."
            )
    finally:
        session.close()
    return DemoTenant(api_key, bindings, uploaded, sample_data)


def chat_body(
    user: str | None, base_model_name: str, content: str = PROMPT, max_tokens: int = MAX_TOKENS
) -> dict[str, object]:
    body: dict[str, object] = {
        "model": base_model_name,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if user is not None:
        body["user"] = user
    return body


def chat(stack: OneBox, api_key: str, body: dict[str, object]) -> dict[str, Any]:
    """One real chat completion through the gateway."""
    resp = httpx.post(
        f"{stack.gateway_url}/v1/chat/completions",
        timeout=300,
        headers={"Authorization": f"Bearer {api_key}"},
        json=body,
    )
    if resp.status_code != 200:
        raise StackError(
            f"the demo request through the gateway failed: HTTP "
            f"{resp.status_code} {resp.text[:500]}"
        )
    answer: dict[str, Any] = resp.json()
    return answer


def first_reply(stack: OneBox, api_key: str, user: str = "alice") -> dict[str, Any]:
    """The toy demo's start-up request (the stack works end to end)."""
    return chat(stack, api_key, chat_body(user, stack.config.base_model_name))


def curl_example(stack: OneBox, api_key: str, user: str = "alice", content: str = PROMPT) -> str:
    body = json.dumps(chat_body(user, stack.config.base_model_name, content))
    return (
        f"curl -s {stack.gateway_url}/v1/chat/completions \\\n"
        f"  -H 'Authorization: Bearer {api_key}' -H 'Content-Type: application/json' \\\n"
        f"  -d {shlex.quote(body)}"
    )


def openai_example(stack: OneBox, tenant: DemoTenant, content: str = PROMPT) -> str:
    api_key = tenant.api_key
    users = ", ".join(repr(u) for u in tenant.users)
    streamed = tenant.users[-1]
    return f"""{shlex.quote(sys.executable)} - <<'EOF'
from openai import OpenAI
client = OpenAI(base_url="{stack.gateway_url}/v1", api_key="{api_key}")
for user in [{users}]:
    reply = client.chat.completions.create(
        model="{stack.config.base_model_name}", user=user, max_tokens={MAX_TOKENS}, temperature=0,
        messages=[{{"role": "user", "content": {content!r}}}])
    print(user, reply.model, repr(reply.choices[0].message.content))
stream = client.chat.completions.create(
    model="{stack.config.base_model_name}", user="{streamed}", max_tokens={MAX_TOKENS}, stream=True,
    messages=[{{"role": "user", "content": {content!r}}}])
print("{streamed} (streamed):", repr("".join(c.choices[0].delta.content or "" for c in stream
                                       if c.choices)))
EOF"""


def examples(stack: OneBox, tenant: DemoTenant, content: str = PROMPT) -> str:
    """The copy-paste block printed once the stack is up."""
    preft = shlex.quote(str(Path(sys.executable).with_name("preft")))
    users = "\n".join(
        f"  {b.user:<6} -> {b.adapter:<14} ({tenant.adapters[b.adapter].type}, "
        f"mode {tenant.adapters[b.adapter].mode})"
        for b in tenant.bindings
    )
    first = tenant.users[0]
    return f"""
Parts (logs in {stack.config.log_dir}/):
  gateway   {stack.gateway_url}   OpenAI API; tenant '{TENANT}', API key {tenant.api_key}
  registry  {stack.registry_url}   REST + OpenAPI at /docs; admin token {stack.admin_token}
  worker    {stack.worker_url}   vLLM + preft plugin (adapters by sha256 from the store)
  redis     {stack.redis_url}
  objects   {stack.config.store_url}

Demo users (the gateway picks the adapter bound to the request's `user`):
{users}

Copy-paste, in another shell:

# chat completion through the gateway as user {first}
{curl_example(stack, tenant.api_key, first, content)}

# the adapters this tenant can name as `model`
curl -s {stack.gateway_url}/v1/models -H 'Authorization: Bearer {tenant.api_key}'

# the official openai client: every demo user, then a stream
{openai_example(stack, tenant, content)}

# the tenant CLI against this registry
export PREFT_REGISTRY_URL={stack.registry_url} PREFT_API_KEY={tenant.api_key}
{preft} adapter list

# train your own PreFT adapter on chat JSONL, upload it, bind a user (docs/training.md)
{preft} train {shlex.quote(str(tenant.sample_data))} --model {shlex.quote(str(stack.model))} \\
  --out {shlex.quote(str(stack.config.var / "my-adapter"))} --steps 16 --lr 5e-3
{preft} adapter upload {shlex.quote(str(stack.config.var / "my-adapter"))} \\
  --name my-adapter --mode prefill
{preft} user bind me my-adapter
"""
