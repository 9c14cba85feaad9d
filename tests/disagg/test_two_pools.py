"""Adapter-free decode through the gateway: a prefill worker (``--role prefill``, adapters)
hands each PreFT request's prompt KV over NIXL to a decode worker (``--role decode``, the
base model only), and the answer equals one worker's and the HF+peft oracle's.

Real processes throughout: two vLLM workers, the registry, the gateway, Redis. Prompt
lengths straddle the KV block size (32 on CPU): a prompt of exactly 64 tokens is the case
stock NIXL crashes the decode engine on (``vllm_compat.kv_connector``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
import pytest

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.gateway.handoff import REMOTE_DECODE
from preft_serve.toymodels import (
    LoraSpec,
    ReftSpec,
    make_lora_adapter,
    make_model,
    make_reft_adapter,
)
from tests.e2e.stack import (
    BASE_NAME,
    WORKER_MAX_MODEL_LEN,
    Base,
    Registry,
    complete,
    metric_total,
    running_gateway,
    running_registry,
    token_ids,
)
from tests.engine import oracle, reft_oracle
from tests.support.canary_split import in_canary
from tests.support.ports import free_port
from tests.support.processes import ServiceProcess
from tests.support.worker_process import start_worker

MAX_TOKENS = 10
KV_LEASE_S = 5  # how long the prefill worker keeps KV no decode worker claims
LENGTHS = (20, 64, 45)  # below, at and between multiples of the block size


def prompt_of(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 250) for _ in range(length)]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    root = tmp_path_factory.mktemp("two-pools")
    return Base(root, make_model("tiny-llama", root / "model"), root / "objects")


@pytest.fixture(scope="module")
def adapters(base: Base) -> dict[str, Path]:
    root = base.root / "adapters"
    return {
        "lora": make_lora_adapter(
            base.model, root / "lora", seed=31, spec=LoraSpec(rank=8, mode=AdapterMode.PREFILL)
        ),
        "lora2": make_lora_adapter(
            base.model, root / "lora2", seed=35, spec=LoraSpec(rank=8, mode=AdapterMode.PREFILL)
        ),
        "direft": make_reft_adapter(
            base.model,
            root / "direft",
            seed=32,
            spec=ReftSpec(AdapterType.DIREFT, rank=4, layers=(0, 1), positions="f3+l3"),
        ),
        "loreft": make_reft_adapter(
            base.model,
            root / "loreft",
            seed=33,
            spec=ReftSpec(AdapterType.LOREFT, rank=4, layers=(0, 1), positions="l4"),
        ),
    }


@pytest.fixture(scope="module")
def prefill_worker(base: Base) -> Iterator[ServiceProcess]:
    args = [
        "--object-store",
        str(base.objects),
        "--adapter-cache-dir",
        str(base.root / "cache"),
        "--max-model-len",
        str(WORKER_MAX_MODEL_LEN),
        "--role",
        "prefill",
        "--kv-port",
        str(free_port()),
        "--kv-lease-s",
        str(KV_LEASE_S),
    ]
    process = start_worker(base.model, base.root, args, name="prefill")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def decode_worker(base: Base) -> Iterator[ServiceProcess]:
    args = [
        "--max-model-len",
        str(WORKER_MAX_MODEL_LEN),
        "--role",
        "decode",
        "--kv-port",
        str(free_port()),
    ]
    process = start_worker(base.model, base.root, args, name="decode")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def stack(
    base: Base, redis_server: str, prefill_worker: ServiceProcess, decode_worker: ServiceProcess
) -> Iterator[tuple[Registry, ServiceProcess]]:
    namespace = "twopools"
    with (
        running_registry(base.root, redis_server, namespace, base.model, base.objects) as registry,
        running_gateway(
            base.root,
            redis_server,
            namespace,
            base.model,
            [prefill_worker.url],
            extra_env={
                "PREFT_GATEWAY_DECODE_WORKER_URLS": decode_worker.url,
                "PREFT_GATEWAY_HEALTH_INTERVAL_S": "0.5",
            },
        ) as gateway,
    ):
        yield registry, gateway


SHAS: dict[str, str] = {}  # adapter name -> content hash, filled by ``tenants``


@pytest.fixture(scope="module")
def tenants(stack: tuple[Registry, ServiceProcess], adapters: dict[str, Path]) -> dict[str, str]:
    """Two tenants' API keys; users bound to each adapter (``u-all``: the LoRA as
    all-token)."""
    registry, _ = stack
    keys = {"a": registry.create_tenant("pools-a"), "b": registry.create_tenant("pools-b")}
    for user, (name, folder, mode) in {
        "u-lora": ("lora", adapters["lora"], "prefill"),
        "u-direft": ("direft", adapters["direft"], "prefill"),
        "u-loreft": ("loreft", adapters["loreft"], "prefill"),
        "u-all": ("lora-all", adapters["lora"], "all"),
    }.items():
        SHAS[name] = registry.upload(keys["a"], name, folder, mode)["sha256"]
        registry.bind(keys["a"], user, name)
    registry.upload(keys["b"], "lora2", adapters["lora2"], "prefill")
    registry.bind(keys["b"], "u-lora2", "lora2")
    return keys


def expected(
    base: Base,
    adapters: dict[str, Path],
    kind: str,
    prompt: list[int],
    max_tokens: int = MAX_TOKENS,
) -> list[int]:
    if kind == "base":
        return oracle.generate_base(base.model, prompt, max_tokens)
    if kind in ("lora", "lora2"):
        return oracle.generate_prefill(base.model, adapters[kind], prompt, max_tokens)
    return reft_oracle.generate_reft(base.model, adapters[kind], prompt, max_tokens)


def counts(usage: dict[str, Any]) -> tuple[int, int, int]:
    return usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]


def handoffs(gateway: ServiceProcess, result: str) -> float:
    return metric_total(gateway.url, "preft_gateway_handoffs_total", result=result)


def test_decode_worker_holds_no_adapter(decode_worker: ServiceProcess) -> None:
    models = httpx.get(f"{decode_worker.url}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == [str(decode_worker_model(decode_worker))]
    reply = complete(decode_worker.url, model="sha256:" + "ab" * 32, max_tokens=2)
    assert reply.status_code == 404, reply.text
    assert "does not exist" in reply.json()["error"]["message"]
    # Started without LoRA support, it has no runtime adapter loading either.
    load = httpx.post(
        f"{decode_worker.url}/v1/load_lora_adapter",
        json={"lora_name": "x", "lora_path": "/tmp"},
        timeout=10,
    )
    assert load.status_code == 404


def tcp_listeners(worker: ServiceProcess) -> set[tuple[str, int]]:
    """Every listening TCP socket of a worker's processes (vLLM's API server, its engine
    core and their children): ``(address, port)``."""
    root = psutil.Process(worker.proc.pid)
    return {
        (c.laddr.ip, c.laddr.port)
        for process in (root, *root.children(recursive=True))
        for c in process.net_connections("inet")
        if c.status == psutil.CONN_LISTEN
    }


def test_pool_workers_listen_on_the_kv_host_only(
    prefill_worker: ServiceProcess, decode_worker: ServiceProcess
) -> None:
    """Both workers run with --kv-host 127.0.0.1 (the default): UCX's KV-transfer listeners
    must open on loopback alone, not on every interface of the host (a host with no other
    interface cannot show the difference)."""
    for worker in (prefill_worker, decode_worker):
        listening = tcp_listeners(worker)
        port = int(worker.url.rsplit(":", 1)[1])
        assert ("127.0.0.1", port) in listening  # the HTTP API: this really is the worker
        assert len(listening) > 2, listening  # and UCX's listeners beside API and side channel
        outside = {(ip, p) for ip, p in listening if not ipaddress.ip_address(ip).is_loopback}
        assert not outside, (worker.url, sorted(outside))


def decode_worker_model(worker: ServiceProcess) -> str:
    return str(httpx.get(f"{worker.url}/v1/models", timeout=10).json()["data"][0]["id"])


def test_two_pools_equal_the_oracle(
    base: Base,
    adapters: dict[str, Path],
    stack: tuple[Registry, ServiceProcess],
    tenants: dict[str, str],
) -> None:
    _, gateway = stack
    before = handoffs(gateway, "decoded")
    got: dict[tuple[str, int], list[int]] = {}
    want: dict[tuple[str, int], list[int]] = {}
    for length in LENGTHS:
        prompt = prompt_of(length, seed=length)
        for kind, who in (
            ("lora", {"user": "u-lora"}),
            ("direft", {"user": "u-direft"}),
            ("loreft", {"user": "u-loreft"}),
            ("base", {"model": BASE_NAME}),
        ):
            got[kind, length] = token_ids(
                complete(
                    gateway.url, api_key=tenants["a"], prompt=prompt, max_tokens=MAX_TOKENS, **who
                )
            )
            want[kind, length] = expected(base, adapters, kind, prompt)
    assert got == want
    for length in LENGTHS:  # the adapters make a difference, or this proves nothing
        assert len({tuple(got[kind, length]) for kind in ("lora", "direft", "loreft", "base")}) == 4
    assert handoffs(gateway, "decoded") - before == len(got)


def test_a_canary_split_is_served_through_both_pools_streamed_or_not(
    base: Base,
    adapters: dict[str, Path],
    stack: tuple[Registry, ServiceProcess],
) -> None:
    """Version 1 (``lora``) serves, version 2 (``lora2``, staged) is a 50% canary: each
    user's answer, whole or streamed, is their version's oracle answer, prefilled with that
    version and decoded on the adapter-free pool, and says which version answered."""
    registry, gateway = stack
    key = registry.create_tenant("pools-split")
    registry.upload(key, "split", adapters["lora"], "prefill")
    staged = httpx.put(
        f"{registry.url}/v1/adapters/split",
        data={"mode": "prefill"},
        files=[("files", (p.name, p.read_bytes())) for p in sorted(adapters["lora2"].iterdir())],
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert staged.status_code == 201 and staged.json()["state"] == "staged", staged.text
    policy = httpx.put(
        f"{registry.url}/v1/adapters/split/policy",
        json={"version": 1, "canary": {"version": 2, "weight": 0.5}},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert policy.status_code == 200, policy.text

    users = [f"split-{i}" for i in range(12)]
    picked = {next(u for u in users if in_canary("split", u, 0.5)): ("2", "lora2"),
              next(u for u in users if not in_canary("split", u, 0.5)): ("1", "lora")}  # fmt: skip
    prompt = prompt_of(45, seed=45)
    before = handoffs(gateway, "decoded")
    for user, (version, kind) in picked.items():
        registry.bind(key, user, "split")
        want = expected(base, adapters, kind, prompt)
        whole = complete(gateway.url, api_key=key, user=user, prompt=prompt, max_tokens=MAX_TOKENS)
        assert token_ids(whole) == want
        assert whole.headers["x-preft-adapter-version"] == version
        streamed = httpx.post(
            f"{gateway.url}/v1/completions",
            json={"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                  "ignore_eos": True, "user": user, "stream": True},
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        )  # fmt: skip
        assert streamed.status_code == 200, streamed.text
        assert streamed.headers["x-preft-adapter-version"] == version
        alone = complete(gateway.url, api_key=key, user=user, prompt=prompt,
                         max_tokens=MAX_TOKENS)  # fmt: skip
        assert stream_text(streamed, chat=False)[0] == alone.json()["choices"][0]["text"]
    assert expected(base, adapters, "lora", prompt) != expected(base, adapters, "lora2", prompt)
    assert handoffs(gateway, "decoded") - before == 6  # every request decoded on the pool


def stream_text(reply: httpx.Response, chat: bool) -> tuple[str, dict[str, Any] | None, str]:
    """The streamed text, the usage chunk's usage and the last finish reason."""
    text, usage, finish = "", None, ""
    for line in reply.text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = orjson.loads(line[6:])
        assert "error" not in event, event
        usage = event.get("usage") or usage
        for choice in event["choices"]:
            text += (choice.get("delta") or {}).get("content") or "" if chat else choice["text"]
            finish = choice.get("finish_reason") or finish
    return text, usage, finish


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "text"])
def test_streams_and_stop_strings_equal_one_worker(
    stack: tuple[Registry, ServiceProcess],
    tenants: dict[str, str],
    prefill_worker: ServiceProcess,
    chat: bool,
) -> None:
    """Streamed and not, with and without a stop string: the same text, usage and finish
    reason as the prefill worker answering alone (the gateway's decode pool not used)."""
    _, gateway = stack
    path = "/v1/chat/completions" if chat else "/v1/completions"
    prompt: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "Tell me a story"}]}
        if chat
        else {"prompt": "Once upon a time"}
    )
    body = {**prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    sha = SHAS["lora"]
    auth = {"Authorization": f"Bearer {tenants['a']}"}

    def alone(**extra: Any) -> dict[str, Any]:
        reply = httpx.post(
            f"{prefill_worker.url}{path}",
            json={**body, **extra, "model": f"sha256:{sha}"},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        return reply.json()  # type: ignore[no-any-return]

    def text_of(answer: dict[str, Any]) -> str:
        choice = answer["choices"][0]
        return str(choice["message"]["content"] if chat else choice["text"])

    whole, first = text_of(alone()), text_of(alone(max_tokens=1))
    assert whole.startswith(first) and len(whole) > len(first) + 2, (first, whole)
    stop = whole[len(first) + 1 : len(first) + 3]  # a stop string after the first token
    cases: list[dict[str, Any]] = [{}, {"stop": [stop]}]
    if first:  # and one that begins in the first token's text (when it has text)
        cases.append({"stop": [whole[len(first) - 1 : len(first) + 1]]})
    for extra in cases:
        expect = alone(**extra)
        want_finish = expect["choices"][0]["finish_reason"]
        plain = httpx.post(
            f"{gateway.url}{path}",
            json={**body, **extra, "user": "u-lora"},
            headers=auth,
            timeout=60,
        )
        assert plain.status_code == 200, plain.text
        got = plain.json()
        assert text_of(got) == text_of(expect)
        assert got["choices"][0]["finish_reason"] == want_finish
        assert got["usage"] == expect["usage"]
        assert got["model"] == "lora" and "kv_transfer_params" not in got
        streamed = httpx.post(
            f"{gateway.url}{path}",
            json={
                **body,
                **extra,
                "user": "u-lora",
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            headers=auth,
            timeout=60,
        )
        assert streamed.status_code == 200, streamed.text
        text, usage, finish = stream_text(streamed, chat)
        assert (text, finish) == (text_of(expect), want_finish)
        assert usage is not None
        assert counts(usage) == counts(expect["usage"])
        if extra:  # the stop string ended both answers early
            assert want_finish == "stop" and extra["stop"][0] not in text


def test_one_token_and_all_token_adapters_are_served_whole(
    base: Base,
    adapters: dict[str, Path],
    stack: tuple[Registry, ServiceProcess],
    tenants: dict[str, str],
) -> None:
    _, gateway = stack
    prompt = prompt_of(40, seed=7)
    decoded = handoffs(gateway, "decoded")
    one = token_ids(
        complete(gateway.url, api_key=tenants["a"], user="u-lora", prompt=prompt, max_tokens=1)
    )
    assert one == expected(base, adapters, "lora", prompt, 1)
    every = token_ids(
        complete(
            gateway.url, api_key=tenants["a"], user="u-all", prompt=prompt, max_tokens=MAX_TOKENS
        )
    )
    assert every == oracle.generate_all(base.model, adapters["lora"], prompt, MAX_TOKENS)
    assert every != expected(base, adapters, "lora", prompt)
    assert handoffs(gateway, "decoded") == decoded
    unified = "preft_gateway_unified_total"
    assert metric_total(gateway.url, unified, reason="one_token") >= 1
    assert metric_total(gateway.url, unified, reason="all_token_adapter") >= 1


def test_same_prompt_of_two_tenants_and_the_base_model_never_share_kv(
    base: Base,
    adapters: dict[str, Path],
    stack: tuple[Registry, ServiceProcess],
    tenants: dict[str, str],
) -> None:
    """Interleaved at once on one decode worker: each answer is its own adapter's."""
    _, gateway = stack
    prompt = prompt_of(64, seed=99)
    calls = [
        ("lora", tenants["a"], {"user": "u-lora"}),
        ("lora2", tenants["b"], {"user": "u-lora2"}),
        ("base", tenants["a"], {"model": BASE_NAME}),
    ] * 3
    got: dict[int, list[int]] = {}

    def call(index: int, api_key: str, who: dict[str, str]) -> None:
        got[index] = token_ids(
            complete(gateway.url, api_key=api_key, prompt=prompt, max_tokens=MAX_TOKENS, **who)
        )

    threads = [
        threading.Thread(target=call, args=(i, key, who)) for i, (_, key, who) in enumerate(calls)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    want = {kind: expected(base, adapters, kind, prompt) for kind in ("lora", "lora2", "base")}
    assert len({tuple(w) for w in want.values()}) == 3
    assert [got.get(i) for i in range(len(calls))] == [want[kind] for kind, _, _ in calls]


def kv_usage(worker: ServiceProcess) -> float:
    return metric_total(worker.url, "vllm:kv_cache_usage_perc")


def test_abandoned_handoffs_free_the_prefill_workers_kv(
    prefill_worker: ServiceProcess, tenants: dict[str, str]
) -> None:
    """1,000 prompts handed off that no decode worker ever claims (a client gone between
    the hops, a decode worker lost): their KV is released after the lease, and the worker
    serves on."""

    async def abandon(count: int) -> list[int]:
        limit = asyncio.Semaphore(16)
        async with httpx.AsyncClient(base_url=prefill_worker.url, timeout=120) as client:

            async def one(index: int) -> int:
                async with limit:
                    reply = await client.post(
                        "/v1/completions",
                        json={
                            "model": f"sha256:{SHAS['lora']}",
                            "prompt": prompt_of(40, index),
                            "max_tokens": 1,
                            "kv_transfer_params": REMOTE_DECODE,
                        },
                    )
                    assert reply.json()["kv_transfer_params"]["remote_block_ids"]
                    return reply.status_code

            return await asyncio.gather(*(one(i) for i in range(count)))

    statuses = asyncio.run(abandon(1000))
    assert statuses == [200] * 1000
    assert kv_usage(prefill_worker) > 0  # the last ones still wait for a decode worker
    deadline = time.monotonic() + KV_LEASE_S + 30
    while kv_usage(prefill_worker) > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert kv_usage(prefill_worker) == 0
    again = complete(prefill_worker.url, model=f"sha256:{SHAS['lora']}", max_tokens=2)
    assert again.status_code == 200, again.text


def test_prefill_worker_lost_after_its_handoff_fails_the_decode_cleanly(
    prefill_worker: ServiceProcess, decode_worker: ServiceProcess
) -> None:
    """The KV a decode worker was told to read is gone with its worker: the request fails
    with an error, never an answer computed without the adapter, and the decode worker
    serves on. The prefill worker then restarts on its address."""
    prompt = prompt_of(45, seed=3)
    first = complete(
        prefill_worker.url,
        model=f"sha256:{SHAS['lora']}",
        prompt=prompt,
        max_tokens=1,
        kv_transfer_params=REMOTE_DECODE,
    ).json()
    first_token = first["choices"][0]["token_ids"]
    prefill_worker.kill()
    started = time.monotonic()
    reply = complete(
        decode_worker.url,
        model=decode_worker_model(decode_worker),
        prompt=prompt + first_token,
        max_tokens=MAX_TOKENS - 1,
        kv_transfer_params=first["kv_transfer_params"],
        timeout=90,
    )
    assert time.monotonic() - started < 60
    assert reply.status_code != 200 or reply.json()["choices"][0]["finish_reason"] == "error", (
        reply.text
    )
    base = complete(decode_worker.url, model=decode_worker_model(decode_worker), max_tokens=3)
    assert base.status_code == 200, base.text
    prefill_worker.start()
    prefill_worker.wait_http("/health", 180)


def test_decode_worker_lost_mid_stream_ends_the_stream_and_prefill_serves_on(
    base: Base,
    adapters: dict[str, Path],
    stack: tuple[Registry, ServiceProcess],
    tenants: dict[str, str],
    decode_worker: ServiceProcess,
) -> None:
    _, gateway = stack
    prompt = prompt_of(30, seed=5)
    body = {
        "prompt": prompt,
        "max_tokens": 3000,
        "temperature": 0,
        "ignore_eos": True,
        "user": "u-lora",
        "stream": True,
    }
    auth = {"Authorization": f"Bearer {tenants['a']}"}
    events = 0
    with httpx.stream(
        "POST", f"{gateway.url}/v1/completions", json=body, headers=auth, timeout=60
    ) as reply:
        assert reply.status_code == 200
        lines = reply.iter_lines()
        for line in lines:
            events += line.startswith("data: ")
            if events == 20:
                decode_worker.kill()
                break
        rest = list(lines)  # the stream must end, not hang
    assert any('"bad_gateway"' in line for line in rest), rest[-3:]
    fallbacks = handoffs(gateway, "fallback")
    served = token_ids(
        complete(
            gateway.url, api_key=tenants["a"], user="u-lora", prompt=prompt, max_tokens=MAX_TOKENS
        )
    )
    assert served == expected(base, adapters, "lora", prompt)
    assert handoffs(gateway, "fallback") == fallbacks + 1
