"""The oracle on a real model: SmolLM2-135M-Instruct (30 layers, GQA, tied embeddings).

Adapters of our own seeds are uploaded through the registry and served by a real worker
behind the gateway; greedy tokens must equal the HF+peft oracle for the base model,
prefill-only LoRA and all-token LoRA, and the three must differ. The worker is a prefill
worker, and a second gateway also has a decode worker (SmolLM2, no adapters): through it the
same PreFT requests are prefilled with the adapter, handed over NIXL and decoded on the base
model, and must equal the same oracle.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from preft_serve.adapters.format import AdapterMode
from preft_serve.toymodels import LoraSpec, make_lora_adapter
from tests.e2e.stack import (
    BASE_NAME,
    Registry,
    complete,
    metric_total,
    running_gateway,
    running_registry,
)
from tests.e2e.stack import token_ids as reply_tokens
from tests.engine import oracle
from tests.support.ports import free_port
from tests.support.processes import ServiceProcess
from tests.support.real_model import real_model_dir
from tests.support.worker_process import start_worker

pytestmark = pytest.mark.real_model

MAX_TOKENS = 12
QUESTION = "Name three things people often keep in a kitchen drawer."


class Stack(NamedTuple):
    registry: Registry
    gateway: ServiceProcess  # in front of the worker alone
    pools: ServiceProcess  # in front of the worker (prefill) and the decode worker
    root: Path


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return real_model_dir()


@pytest.fixture(scope="module")
def stack(
    smollm2: Path, tmp_path_factory: pytest.TempPathFactory, redis_server: str
) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("real-model")
    objects, namespace = root / "objects", f"real{uuid.uuid4().hex[:8]}"
    small = ["--max-model-len", "512", "--kv-cache-gib", "0.25"]
    worker = start_worker(
        smollm2,
        root,
        [
            "--object-store",
            str(objects),
            "--adapter-cache-dir",
            str(root / "cache"),
            *small,
            "--role",
            "prefill",
            "--kv-port",
            str(free_port()),
        ],
        timeout=300,
    )
    decode = start_worker(
        smollm2,
        root,
        [*small, "--role", "decode", "--kv-port", str(free_port())],
        timeout=300,
        name="decode",
    )
    try:
        with (
            running_registry(root, redis_server, namespace, smollm2, objects) as registry,
            running_gateway(root, redis_server, namespace, smollm2, [worker.url]) as gw,
            running_gateway(
                root,
                redis_server,
                namespace,
                smollm2,
                [worker.url],
                name="gateway-pools",
                extra_env={"PREFT_GATEWAY_DECODE_WORKER_URLS": decode.url},
            ) as pools,
        ):
            yield Stack(registry, gw, pools, root)
    finally:
        decode.stop()
        worker.stop()


def chat_prompt(model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_smollm2_through_the_gateway_equals_the_oracle(smollm2: Path, stack: Stack) -> None:
    registry, gateway, root = stack.registry, stack.gateway, stack.root
    # Gentle random weights: the adapted model still writes text, but other text.
    lora = make_lora_adapter(
        smollm2, root / "lora", seed=2026, spec=LoraSpec(rank=8, std=0.1, mode=AdapterMode.PREFILL)
    )
    key = registry.create_tenant("smol")
    for user, mode in (("u-prefill", "prefill"), ("u-all", "all")):
        registry.upload(key, f"lora-{mode}", lora, mode)
        registry.bind(key, user, f"lora-{mode}")
    prompt = chat_prompt(smollm2)

    def served(**who: str) -> list[int]:
        return reply_tokens(
            complete(
                gateway.url, api_key=key, prompt=prompt, max_tokens=MAX_TOKENS, timeout=300, **who
            )
        )

    got = {
        "base": served(model=BASE_NAME),
        "prefill": served(user="u-prefill"),
        "all": served(user="u-all"),
    }
    want = {
        "base": oracle.generate_base(smollm2, prompt, MAX_TOKENS),
        "prefill": oracle.generate_prefill(smollm2, lora, prompt, MAX_TOKENS),
        "all": oracle.generate_all(smollm2, lora, prompt, MAX_TOKENS),
    }
    assert got == want
    assert len({tuple(t) for t in got.values()}) == 3, got
    assert got["prefill"][0] == got["all"][0]  # the first token comes from the adapted prompt


def test_smollm2_with_a_decode_pool_equals_the_oracle(smollm2: Path, stack: Stack) -> None:
    """Prefill with the adapter, decode on an adapter-free SmolLM2: the oracle's tokens,
    for a PreFT LoRA and for the base model, every one handed off."""
    registry, pools, root = stack.registry, stack.pools, stack.root
    lora = make_lora_adapter(
        smollm2,
        root / "lora-pools",
        seed=2027,
        spec=LoraSpec(rank=8, std=0.1, mode=AdapterMode.PREFILL),
    )
    key = registry.create_tenant("smol-pools")
    registry.upload(key, "pools-lora", lora, "prefill")
    registry.bind(key, "u-pools", "pools-lora")
    prompt = chat_prompt(smollm2)
    before = metric_total(pools.url, "preft_gateway_handoffs_total", result="decoded")

    def served(**who: str) -> list[int]:
        return reply_tokens(
            complete(
                pools.url, api_key=key, prompt=prompt, max_tokens=MAX_TOKENS, timeout=300, **who
            )
        )

    got = {"base": served(model=BASE_NAME), "prefill": served(user="u-pools")}
    want = {
        "base": oracle.generate_base(smollm2, prompt, MAX_TOKENS),
        "prefill": oracle.generate_prefill(smollm2, lora, prompt, MAX_TOKENS),
    }
    assert got == want
    assert got["base"] != got["prefill"]
    assert metric_total(pools.url, "preft_gateway_handoffs_total", result="decoded") - before == 2
