"""``/v1/responses`` through the gateway on a real worker (vLLM's Responses server): the
adapter bound to the user runs, the answer is the one the same conversation gets from
``/v1/chat/completions`` (greedy), and it names the adapter, not its content address."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
import redis
from openai import OpenAI

from preft_serve.adapters.format import AdapterMode
from preft_serve.common.registry_client import RegistryKeys, parse_usage
from preft_serve.gateway.usage import utc_day
from preft_serve.toymodels import LoraSpec, make_lora_adapter
from tests.e2e.stack import BASE_NAME, Base, Registry
from tests.support.leaving_client import leave_after_headers
from tests.support.processes import ServiceProcess

QUESTION = [{"role": "user", "content": "Say something."}]
TOKENS = 8


def test_responses_run_the_users_adapter_like_chat(
    gateway: ServiceProcess, registry: Registry, base: Base
) -> None:
    key = registry.create_tenant("responses")
    adapter = make_lora_adapter(
        base.model,
        base.root / "responses-lora",
        seed=41,
        spec=LoraSpec(rank=8, mode=AdapterMode.ALL),
    )
    registry.upload(key, "resp-bot", adapter, "all")
    registry.bind(key, "rita", "resp-bot")
    client = OpenAI(
        base_url=f"{gateway.url}/v1",
        api_key=key,
        max_retries=0,
        http_client=httpx.Client(timeout=120),
    )
    for who in ({"user": "rita"}, {}):
        raw = client.responses.with_raw_response.create(
            model=BASE_NAME, input=QUESTION, max_output_tokens=TOKENS, temperature=0, **who
        )
        reply = raw.parse()
        chat = client.chat.completions.create(
            model=BASE_NAME,
            messages=QUESTION,
            max_tokens=TOKENS,
            temperature=0,  # type: ignore[arg-type]
            **who,
        )
        assert reply.output_text == chat.choices[0].message.content
        name = "resp-bot" if who else BASE_NAME
        assert reply.model == chat.model == name
        assert raw.headers["x-preft-adapter"] == ("resp-bot" if who else "none")
        assert reply.usage is not None and reply.usage.output_tokens > 0
    with client.responses.stream(
        model=BASE_NAME, input=QUESTION, user="rita", max_output_tokens=TOKENS, temperature=0
    ) as stream:
        streamed = stream.get_final_response()
    assert streamed.model == "resp-bot"


def _usage(redis_url: str, namespace: str, tenant: str, model: str) -> dict[str, int]:
    """The tenant's usage of ``model`` today, as the gateway wrote it to Redis."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        raw = client.hgetall(RegistryKeys(namespace).usage(tenant, utc_day()))
    finally:
        client.close()
    return parse_usage(raw).get(model, {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0})


def test_a_stream_the_client_left_is_billed_its_request_and_prompt(
    gateway: ServiceProcess,
    registry: Registry,
    worker: ServiceProcess,
    base: Base,
    redis_server: str,
    namespace: str,
) -> None:
    """A client that leaves a streamed response right after its headers: vLLM reports
    usage only in the final event, which never comes; the request and its prompt (as the
    worker counts it) are billed all the same."""
    key = registry.create_tenant("responses-leaver")
    body = {
        "model": BASE_NAME,
        "instructions": "Answer briefly.",
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Say something."}],
            }
        ],
        "max_output_tokens": 64,
        "temperature": 0,
    }
    direct = httpx.post(
        f"{worker.url}/v1/responses",
        timeout=120,
        json={**body, "model": str(base.model), "max_output_tokens": 1},
    )
    assert direct.status_code == 200, direct.text
    prompt_tokens = direct.json()["usage"]["input_tokens"]
    assert prompt_tokens > 0
    tries = 3
    for _ in range(tries):
        head = leave_after_headers(gateway.url, "/v1/responses", key, {**body, "stream": True})
        assert head.startswith(b"HTTP/1.1 200"), head
    deadline = time.monotonic() + 60
    while _usage(redis_server, namespace, "responses-leaver", BASE_NAME)["requests"] < tries:
        assert time.monotonic() < deadline, _usage(
            redis_server, namespace, "responses-leaver", BASE_NAME
        )
        time.sleep(0.2)
    time.sleep(2.5)  # two flush intervals: anything counted twice is written by now
    usage = _usage(redis_server, namespace, "responses-leaver", BASE_NAME)
    assert usage["requests"] == tries
    assert usage["prompt_tokens"] == tries * prompt_tokens
    assert 0 <= usage["completion_tokens"] <= tries * 64


def test_tools_without_a_tool_parser_are_refused_and_not_billed(
    gateway: ServiceProcess, registry: Registry, redis_server: str, namespace: str
) -> None:
    """This worker runs without a tool-call parser, so its Responses server would answer
    in plain text: the gateway refuses as the chat route does, and bills nothing."""
    key = registry.create_tenant("responses-tools")
    client = OpenAI(
        base_url=f"{gateway.url}/v1",
        api_key=key,
        max_retries=0,
        http_client=httpx.Client(timeout=120),
    )
    tools = [
        {
            "type": "function",
            "name": "now",
            "description": "The time",
            "parameters": {"type": "object", "properties": {}},
        }
    ]
    for choice in ("auto", "required"):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(
                model=BASE_NAME,
                input="What time is it?",
                tools=tools,
                tool_choice=choice,  # type: ignore[arg-type]
                max_output_tokens=TOKENS,
            )
        assert (refused.value.code, refused.value.param) == ("tool_calling_disabled", "tools")
        assert "tool calling is not enabled" in refused.value.message
    time.sleep(2.5)  # two flush intervals: a billed request would be written by now
    assert _usage(redis_server, namespace, "responses-tools", BASE_NAME)["requests"] == 0
