"""End to end: real Redis, the registry app, a real vLLM worker process, the gateway.

The official ``openai`` client talks to the gateway with a tenant key and ``user="u1"``
(bound to a LoRA in the registry); the answer must be exactly what the worker gives for
``model="sha256:<that adapter's sha>"`` directly, which proves the gateway picked, rewrote
and proxied the right adapter.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
import redis
from fastapi.testclient import TestClient

from preft_serve.adapters.format import AdapterMode
from preft_serve.common.objectstore import ObjectStoreSettings
from preft_serve.common.registry_client import RegistryKeys, parse_usage
from preft_serve.gateway.app import create_app as create_gateway
from preft_serve.gateway.proxy import TOOLS_OFF
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.gateway.usage import utc_day
from preft_serve.registry.app import create_app as create_registry
from preft_serve.registry.settings import RegistrySettings
from preft_serve.toymodels import LoraSpec, make_lora_adapter, make_model
from tests.support.inprocess import serve_in_thread
from tests.support.leaving_client import leave_after_headers
from tests.support.worker_process import running_worker

ADMIN = "e2e-admin-0123456789abcdef"
PROMPT = [{"role": "user", "content": "The quick brown fox"}]


@dataclass
class Stack:
    gateway: str
    worker: str
    api_key: str
    sha: str
    redis_url: str
    namespace: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("gateway-e2e")
    model = make_model("tiny-llama", root / "model")
    adapter = make_lora_adapter(
        model, root / "lora", seed=1, spec=LoraSpec(rank=8, mode=AdapterMode.PREFILL)
    )
    objects = root / "objects"
    namespace = f"g{uuid.uuid4().hex[:10]}"
    registry_settings = RegistrySettings(
        admin_token=ADMIN,
        redis_url=redis_server,
        namespace=namespace,
        base_model=model,
        object_store=ObjectStoreSettings(url=str(objects)),
        staging_dir=root,
    )
    with TestClient(create_registry(registry_settings)) as registry:
        tenant = registry.post(
            "/v1/tenants", json={"name": "acme"}, headers={"Authorization": f"Bearer {ADMIN}"}
        )
        assert tenant.status_code == 201, tenant.text
        auth = {"Authorization": f"Bearer {tenant.json()['api_key']}"}
        files = [
            ("files", (p.name, p.read_bytes(), "application/octet-stream"))
            for p in sorted(adapter.iterdir())
            if p.is_file()
        ]
        up = registry.post(
            "/v1/adapters", data={"name": "bot", "mode": "prefill"}, files=files, headers=auth
        )
        assert up.status_code == 201, up.text
        bind = registry.put("/v1/users/u1", json={"adapter": "bot"}, headers=auth)
        assert bind.status_code == 200, bind.text
        api_key, sha = tenant.json()["api_key"], up.json()["sha256"]

    worker_args = [
        "--object-store",
        str(objects),
        "--adapter-cache-dir",
        str(root / "cache"),
        "--adapter-cache-gib",
        "0.01",
    ]
    with running_worker(model, root, worker_args) as worker_url:
        settings = GatewaySettings(
            redis_url=redis_server,
            namespace=namespace,
            worker_urls=[worker_url],
            base_model_name="tiny-llama",
            worker_base_model=str(model),
        )
        server, thread, gateway_url = serve_in_thread(create_gateway(settings))
        try:
            yield Stack(gateway_url, worker_url, api_key, sha, redis_server, namespace)
        finally:
            server.should_exit = True
            thread.join(10)


def _generated_tokens(gateway: str) -> float:
    text = httpx.get(f"{gateway}/metrics", timeout=10).text
    match = re.search(
        r'^preft_gateway_generation_tokens_total\{adapter="bot"\} (\S+)$', text, re.MULTILINE
    )
    return float(match.group(1)) if match else 0.0


def test_openai_client_through_gateway_matches_worker(stack: Stack) -> None:
    direct = httpx.post(
        f"{stack.worker}/v1/chat/completions",
        timeout=60,
        json={
            "model": f"sha256:{stack.sha}",
            "messages": PROMPT,
            "max_tokens": 8,
            "temperature": 0,
        },
    )
    assert direct.status_code == 200, direct.text
    expected = direct.json()["choices"][0]["message"]["content"]

    client = openai.OpenAI(
        base_url=f"{stack.gateway}/v1", api_key=stack.api_key, max_retries=0, timeout=60
    )
    assert httpx.get(f"{stack.gateway}/readyz", timeout=10).status_code == 200
    before = _generated_tokens(stack.gateway)
    reply = client.chat.completions.create(
        model="tiny-llama", messages=PROMPT, user="u1", max_tokens=8, temperature=0
    )  # type: ignore[arg-type]
    assert reply.choices[0].message.content == expected
    assert reply.model == "bot"
    assert reply.usage is not None
    assert _generated_tokens(stack.gateway) - before == reply.usage.completion_tokens > 0

    stream = client.chat.completions.create(
        model="tiny-llama", messages=PROMPT, user="u1", max_tokens=8, temperature=0, stream=True
    )  # type: ignore[arg-type]
    pieces = []
    for chunk in stream:
        assert chunk.model == "bot"
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    assert "".join(pieces) == expected
    assert _generated_tokens(stack.gateway) - before == 2 * reply.usage.completion_tokens

    models = client.models.list()
    assert [m.id for m in models.data] == ["bot", "tiny-llama"]


def test_wrong_key_and_unknown_user(stack: Stack) -> None:
    bad = openai.OpenAI(base_url=f"{stack.gateway}/v1", api_key="pft_wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="tiny-llama", messages=PROMPT, user="u1")  # type: ignore[arg-type]
    good = openai.OpenAI(base_url=f"{stack.gateway}/v1", api_key=stack.api_key, max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        good.chat.completions.create(
            messages=PROMPT,
            user="nobody",  # type: ignore[call-overload]
            model=openai.NOT_GIVEN,
        )
    assert "user nobody has no adapter binding; bind one with PUT /v1/users/nobody" in str(
        info.value
    )


def test_errors_reach_the_openai_client_in_openais_terms(stack: Stack) -> None:
    """What the official client exposes (status, ``e.type``, ``e.code``, ``e.param``) for
    the gateway's own refusals and for errors the real vLLM worker answered (vLLM writes
    ``type: BadRequestError`` and ``code: 400``; the gateway rewrites them)."""
    bad = openai.OpenAI(base_url=f"{stack.gateway}/v1", api_key="pft_wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        bad.chat.completions.create(model="tiny-llama", messages=PROMPT, user="u1")  # type: ignore[arg-type]
    assert (auth.value.status_code, auth.value.type, auth.value.code) == (
        401,
        "authentication_error",
        "invalid_api_key",
    )

    client = openai.OpenAI(
        base_url=f"{stack.gateway}/v1", api_key=stack.api_key, max_retries=0, timeout=60
    )
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-adapter", messages=PROMPT)  # type: ignore[arg-type]
    assert (missing.value.type, missing.value.code, missing.value.param) == (
        "invalid_request_error",
        "model_not_found",
        "model",
    )
    assert missing.value.body["message"] == (  # type: ignore[index]
        "model 'no-such-adapter' does not exist; GET /v1/models lists yours"
    )

    with pytest.raises(openai.BadRequestError) as capped:
        client.chat.completions.create(
            model="tiny-llama",
            messages=PROMPT,
            user="u1",  # type: ignore[arg-type]
            n=1000,
        )
    assert (capped.value.type, capped.value.code, capped.value.param) == (
        "invalid_request_error",
        "invalid_value",
        "n",
    )

    # The worker runs with --max-model-len 256: a longer prompt is refused by vLLM itself.
    long_prompt = [{"role": "user", "content": "fox " * 600}]
    direct = httpx.post(
        f"{stack.worker}/v1/chat/completions",
        timeout=60,
        json={"model": f"sha256:{stack.sha}", "messages": long_prompt, "max_tokens": 8},
    )
    assert direct.status_code == 400 and isinstance(direct.json()["error"]["code"], int)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as too_long:
            client.chat.completions.create(
                model="tiny-llama",
                messages=long_prompt,  # type: ignore[arg-type]
                user="u1",
                max_tokens=8,
                stream=stream,
            )
        assert (too_long.value.status_code, too_long.value.type, too_long.value.code) == (
            400,
            "invalid_request_error",
            "context_length_exceeded",
        )
        assert too_long.value.body["message"] == direct.json()["error"]["message"]  # type: ignore[index]

    # This worker runs without a tool-call parser: vLLM's refusal names its server flags,
    # which the gateway turns into something a client can act on.
    tools = [
        {
            "type": "function",
            "function": {"name": "now", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    direct = httpx.post(
        f"{stack.worker}/v1/chat/completions",
        timeout=60,
        json={
            "model": f"sha256:{stack.sha}",
            "messages": PROMPT,
            "max_tokens": 8,
            "tools": tools,
            "tool_choice": "auto",
        },
    )
    assert direct.status_code == 400 and "--tool-call-parser" in direct.text
    with pytest.raises(openai.BadRequestError) as tools_off:
        client.chat.completions.create(
            model="tiny-llama",
            messages=PROMPT,
            user="u1",  # type: ignore[arg-type]
            max_tokens=8,
            tools=tools,
            tool_choice="auto",
        )  # type: ignore[arg-type]
    assert (tools_off.value.code, tools_off.value.param) == ("tool_calling_disabled", "tool_choice")
    message = tools_off.value.body["message"]  # type: ignore[index]
    assert message == TOOLS_OFF and "--" not in message


def test_tokenizer_routes_are_the_workers(stack: Stack) -> None:
    """``/tokenize`` and ``/detokenize`` through the gateway, for an adapter: the worker's
    own answers for its base model (every adapter shares the tokenizer)."""
    auth = {"Authorization": f"Bearer {stack.api_key}"}
    direct = httpx.post(
        f"{stack.worker}/tokenize", timeout=30, json={"prompt": "the quick brown fox"}
    ).json()
    through = httpx.post(
        f"{stack.gateway}/tokenize",
        headers=auth,
        timeout=30,
        json={"model": "tiny-llama", "user": "u1", "prompt": "the quick brown fox"},
    )
    assert through.status_code == 200, through.text
    assert through.json()["tokens"] == direct["tokens"] and len(direct["tokens"]) > 2
    back = httpx.post(
        f"{stack.gateway}/detokenize", headers=auth, timeout=30, json={"tokens": direct["tokens"]}
    )
    assert (
        back.status_code == 200
        and back.json()["prompt"]
        == httpx.post(
            f"{stack.worker}/detokenize", json={"tokens": direct["tokens"]}, timeout=30
        ).json()["prompt"]
    )
    version = httpx.get(f"{stack.gateway}/version", headers=auth, timeout=30)
    assert version.json() == httpx.get(f"{stack.worker}/version", timeout=30).json()


VOCABULARY = 320  # the toy tiny-llama's (its tokenizer's and its embedding's)
CONTEXT = 256  # the worker's --max-model-len (tests.support.worker_process)


def test_detokenize_refuses_ids_outside_the_vocabulary_as_completions_do(stack: Stack) -> None:
    auth = {"Authorization": f"Bearer {stack.api_key}"}
    inside = httpx.post(
        f"{stack.gateway}/detokenize",
        headers=auth,
        timeout=30,
        json={"tokens": [104, VOCABULARY - 1]},
    )
    assert inside.status_code == 200, inside.text
    for url, headers in ((stack.gateway, auth), (stack.worker, {})):  # the worker's own too
        outside = httpx.post(
            f"{url}/detokenize",
            headers=headers,
            timeout=30,
            json={"tokens": [104, VOCABULARY, 5000]},
        )
        assert outside.status_code == 400, outside.text
        error = outside.json()["error"]
        assert error["param"] == "tokens"
        assert error["message"] == (
            f"token id {VOCABULARY} is outside the vocabulary of "
            f"{VOCABULARY} tokens; token ids run from 0 to "
            f"{VOCABULARY - 1}"
        )
    through = httpx.post(
        f"{stack.gateway}/detokenize", headers=auth, timeout=30, json={"tokens": [VOCABULARY]}
    ).json()["error"]
    assert (through["type"], through["param"]) == ("invalid_request_error", "tokens")
    completion = httpx.post(
        f"{stack.gateway}/v1/completions",
        headers=auth,
        timeout=30,
        json={"model": "tiny-llama", "prompt": [104, VOCABULARY], "max_tokens": 1},
    )
    assert completion.status_code == 400  # the same id in a completion's prompt


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "x" * (CONTEXT + 1)},  # tokenized up to one past the context, then refused
        {"prompt": "x" * 200_000},  # longer than the context could hold: refused untokenized
        {"messages": [{"role": "user", "content": "x" * (CONTEXT + 1)}]},
    ],
)
def test_tokenize_refuses_a_prompt_longer_than_the_context(
    stack: Stack, body: dict[str, Any]
) -> None:
    auth = {"Authorization": f"Bearer {stack.api_key}"}
    reply = httpx.post(f"{stack.gateway}/tokenize", headers=auth, json=body, timeout=30)
    assert reply.status_code == 400, reply.text[:300]
    error = reply.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["param"] == next(iter(body))
    assert f"maximum context length is {CONTEXT} tokens" in error["message"]
    fits = httpx.post(
        f"{stack.gateway}/tokenize", headers=auth, timeout=30, json={"prompt": "x" * (CONTEXT - 8)}
    )
    assert fits.status_code == 200 and fits.json()["count"] <= CONTEXT


def _usage(stack: Stack) -> dict[str, int]:
    """The tenant's usage of adapter ``bot`` today, as the gateway wrote it to Redis."""
    client = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        raw = client.hgetall(RegistryKeys(stack.namespace).usage("acme", utc_day()))
    finally:
        client.close()
    return parse_usage(raw).get("bot", {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0})


def _grown_by(stack: Stack, before: dict[str, int], requests: int) -> dict[str, int]:
    """The usage's growth since ``before`` once it counts ``requests`` more requests, and
    still after the next flush (so a late second count would show)."""
    deadline = time.monotonic() + 60
    while _usage(stack)["requests"] - before["requests"] < requests:
        assert time.monotonic() < deadline, (before, _usage(stack))
        time.sleep(0.2)
    time.sleep(2.5)  # two flush intervals: anything counted twice is written by now
    return {kind: n - before[kind] for kind, n in _usage(stack).items()}


@pytest.mark.parametrize(
    ("path", "prompt"),
    [
        ("/v1/chat/completions", {"messages": PROMPT}),
        ("/v1/completions", {"prompt": "The quick brown fox"}),
    ],
)
def test_a_client_leaving_right_after_the_headers_is_billed_its_prompt(
    stack: Stack, path: str, prompt: dict[str, Any]
) -> None:
    """The worker started on the request once the gateway sent the headers: the request
    and its prompt are billed, whenever the client leaves (here before any chunk)."""
    direct = httpx.post(
        f"{stack.worker}{path}",
        timeout=60,
        json={"model": f"sha256:{stack.sha}", "max_tokens": 1, **prompt},
    )
    assert direct.status_code == 200, direct.text
    prompt_tokens = direct.json()["usage"]["prompt_tokens"]
    assert prompt_tokens > 0
    time.sleep(2.5)  # two flush intervals: what earlier tests used is written by now
    before, tries, max_tokens = _usage(stack), 3, 64
    for _ in range(tries):
        head = leave_after_headers(
            stack.gateway,
            path,
            stack.api_key,
            {
                "model": "tiny-llama",
                "user": "u1",
                "stream": True,
                "max_tokens": max_tokens,
                **prompt,
            },
        )
        assert head.startswith(b"HTTP/1.1 200"), head
    grown = _grown_by(stack, before, tries)
    assert (grown["requests"], grown["prompt_tokens"]) == (tries, tries * prompt_tokens), grown
    assert 0 <= grown["completion_tokens"] <= tries * max_tokens
