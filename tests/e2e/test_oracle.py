"""Upload via REST -> bind a user -> completion through the gateway -> the exact greedy
tokens of the HF+peft oracle (and the HF ReFT hook oracle) for that adapter and mode.

The same LoRA weights are uploaded twice, as PreFT (``prefill``) and classic (``all``):
two hashes, two users. Base, prefill, all and DiReFT must all give different tokens, or
the comparison would prove nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.toymodels import LoraSpec, ReftSpec, make_lora_adapter, make_reft_adapter
from tests.e2e.stack import BASE_NAME, PROMPT, Base, Registry, complete, token_ids
from tests.engine import oracle, reft_oracle
from tests.support.processes import ServiceProcess

MAX_TOKENS = 16


@pytest.fixture(scope="module")
def adapters(base: Base) -> dict[str, Path]:
    root = base.root / "oracle-adapters"
    return {
        "lora": make_lora_adapter(
            base.model, root / "lora", seed=31, spec=LoraSpec(rank=8, mode=AdapterMode.PREFILL)
        ),
        "direft": make_reft_adapter(
            base.model,
            root / "direft",
            seed=32,
            spec=ReftSpec(AdapterType.DIREFT, rank=4, layers=(0, 1), positions="f3+l3"),
        ),
    }


@pytest.fixture(scope="module")
def api_key(registry: Registry, adapters: dict[str, Path]) -> str:
    key = registry.create_tenant("oracle")
    for user, (name, folder, mode) in {
        "u-prefill": ("lora-prefill", adapters["lora"], "prefill"),
        "u-all": ("lora-all", adapters["lora"], "all"),
        "u-direft": ("direft", adapters["direft"], "prefill"),
    }.items():
        stored = registry.upload(key, name, folder, mode)
        assert stored["mode"] == mode
        registry.bind(key, user, name)
    return key


def test_gateway_output_equals_oracle_per_adapter_and_mode(
    gateway: ServiceProcess, api_key: str, base: Base, adapters: dict[str, Path]
) -> None:
    def via_gateway(**who: str) -> list[int]:
        reply = complete(gateway.url, api_key=api_key, max_tokens=MAX_TOKENS, **who)
        assert len(token_ids(reply)) == reply.json()["usage"]["completion_tokens"] == MAX_TOKENS
        return token_ids(reply)

    got = {
        "base": via_gateway(model=BASE_NAME),
        "prefill": via_gateway(user="u-prefill"),
        "all": via_gateway(user="u-all"),
        "direft": via_gateway(user="u-direft"),
    }
    want = {
        "base": oracle.generate_base(base.model, PROMPT, MAX_TOKENS),
        "prefill": oracle.generate_prefill(base.model, adapters["lora"], PROMPT, MAX_TOKENS),
        "all": oracle.generate_all(base.model, adapters["lora"], PROMPT, MAX_TOKENS),
        "direft": reft_oracle.generate_reft(base.model, adapters["direft"], PROMPT, MAX_TOKENS),
    }
    assert got == want
    assert len({tuple(tokens) for tokens in got.values()}) == 4, got
    # PreFT's first token comes from the adapted prompt, the rest from the base model.
    assert got["prefill"][0] == got["all"][0]


def test_named_adapter_equals_bound_user(gateway: ServiceProcess, api_key: str) -> None:
    """``model=<adapter name>`` runs the same adapter as the user bound to it."""
    by_name = token_ids(
        complete(gateway.url, api_key=api_key, model="lora-all", max_tokens=MAX_TOKENS)
    )
    by_user = token_ids(complete(gateway.url, api_key=api_key, user="u-all", max_tokens=MAX_TOKENS))
    assert by_name == by_user
    reply = complete(gateway.url, api_key=api_key, model="lora-all", max_tokens=MAX_TOKENS)
    assert reply.json()["model"] == "lora-all"  # the name, not the worker's sha256:<hex>
