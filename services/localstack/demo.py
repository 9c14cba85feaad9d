"""The demo tenant of ``make run``: its adapters, its users, and the examples printed for it."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from pathlib import Path

import httpx
from preft_serve.common.adapter_format import AdapterMode
from preft_serve.localstack.processes import StackError
from preft_serve.localstack.seed import TenantSession, Uploaded, create_tenant
from preft_serve.localstack.stack import LocalStack
from preft_serve.worker.demo import DEMO_ADAPTERS, DEMO_REFT_ADAPTERS

TENANT = "demo"
# user -> the demo adapter (folder name under var/demo/adapters, and its registry name).
DEMO_USERS = {
    "alice": "alice-prefill",
    "bob": "bob-prefill",
    "carol": "carol-all",
    "dave": "dave-direft",
    "erin": "erin-loreft",
}
PROMPT = "Hello"


def demo_mode(adapter: str) -> AdapterMode:
    """The mode each demo adapter was generated for (ReFT is always prefill-only)."""
    if adapter in DEMO_ADAPTERS:
        return DEMO_ADAPTERS[adapter][1]
    if adapter in DEMO_REFT_ADAPTERS:
        return AdapterMode.PREFILL
    raise KeyError(adapter)


@dataclasses.dataclass
class DemoTenant:
    api_key: str
    adapters: dict[str, Uploaded]  # by name


def seed_demo(stack: LocalStack, adapters_dir: Path) -> DemoTenant:
    """Create the demo tenant, upload the demo adapters (both modes), bind the demo users."""
    api_key = create_tenant(stack.registry_url, stack.admin_token, TENANT)
    session = TenantSession(stack.registry_url, api_key)
    uploaded: dict[str, Uploaded] = {}
    try:
        for user, name in DEMO_USERS.items():
            up = session.upload(adapters_dir / name, name, demo_mode(name))
            session.bind(user, name)
            uploaded[name] = up
            stack.say(f"  {user:<6}-> {name:<14} {up.type:<7} mode {up.mode:<8} "
                      f"sha256:{up.sha256[:12]}...")
    finally:
        session.close()
    return DemoTenant(api_key, uploaded)


def chat_body(user: str, base_model_name: str, max_tokens: int = 16) -> dict[str, object]:
    return {"model": base_model_name, "user": user,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens, "temperature": 0}


def first_reply(stack: LocalStack, api_key: str, user: str = "alice") -> dict[str, object]:
    """One real chat completion through the gateway (the stack works end to end)."""
    resp = httpx.post(f"{stack.gateway_url}/v1/chat/completions", timeout=120,
                      headers={"Authorization": f"Bearer {api_key}"},
                      json=chat_body(user, stack.config.base_model_name))
    if resp.status_code != 200:
        raise StackError(f"the demo request through the gateway failed: HTTP "
                         f"{resp.status_code} {resp.text[:500]}")
    return resp.json()  # type: ignore[no-any-return]


def curl_example(stack: LocalStack, api_key: str, user: str = "alice") -> str:
    body = json.dumps(chat_body(user, stack.config.base_model_name))
    return (f"curl -s {stack.gateway_url}/v1/chat/completions \\\n"
            f"  -H 'Authorization: Bearer {api_key}' -H 'Content-Type: application/json' \\\n"
            f"  -d {shlex.quote(body)}")


def openai_example(stack: LocalStack, api_key: str) -> str:
    users = ", ".join(repr(u) for u in DEMO_USERS)
    return f"""{shlex.quote(sys.executable)} - <<'EOF'
from openai import OpenAI
client = OpenAI(base_url="{stack.gateway_url}/v1", api_key="{api_key}")
for user in [{users}]:
    reply = client.chat.completions.create(
        model="{stack.config.base_model_name}", user=user, max_tokens=16, temperature=0,
        messages=[{{"role": "user", "content": "{PROMPT}"}}])
    print(user, reply.model, repr(reply.choices[0].message.content))
stream = client.chat.completions.create(
    model="{stack.config.base_model_name}", user="dave", max_tokens=16, stream=True,
    messages=[{{"role": "user", "content": "{PROMPT}"}}])
print("dave (streamed):", repr("".join(c.choices[0].delta.content or "" for c in stream
                                       if c.choices)))
EOF"""


def examples(stack: LocalStack, tenant: DemoTenant) -> str:
    """The copy-paste block printed once the stack is up."""
    preft = shlex.quote(str(Path(sys.executable).with_name("preft")))
    users = "\n".join(f"  {u:<6} -> {a:<14} ({tenant.adapters[a].type}, mode "
                      f"{tenant.adapters[a].mode})" for u, a in DEMO_USERS.items())
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

# chat completion through the gateway as user alice
{curl_example(stack, tenant.api_key)}

# the adapters this tenant can name as `model`
curl -s {stack.gateway_url}/v1/models -H 'Authorization: Bearer {tenant.api_key}'

# the official openai client: every demo user, then a stream
{openai_example(stack, tenant.api_key)}

# the tenant CLI against this registry
export PREFT_REGISTRY_URL={stack.registry_url} PREFT_API_KEY={tenant.api_key}
{preft} adapter list
"""
