"""ReFT-P: DiReFT / LoReFT on prompt positions only, exact against the HF hook oracle."""

from __future__ import annotations

import pytest

from tests.engine import oracle, reft_oracle
from tests.support.engine import (
    BATCH_TOKENS,
    KV_BLOCK,
    MAX_LORAS,
    MAX_TOKENS,
    REFT_SPECS,
    Engine,
    prompt,
)


def expected(engine: Engine, name: str | None, tokens: list[int]) -> list[int]:
    if name is None:
        return oracle.generate_base(engine.model_dir, tokens, MAX_TOKENS)
    if name in REFT_SPECS:
        return reft_oracle.generate_reft(
            engine.model_dir, engine.adapters[name], tokens, MAX_TOKENS
        )
    generate = oracle.generate_prefill if name.startswith("prefill") else oracle.generate_all
    return generate(engine.model_dir, engine.adapters[name], tokens, MAX_TOKENS)


@pytest.mark.parametrize("name", sorted(REFT_SPECS))
def test_reft_p_matches_oracle_and_differs_from_base_and_all_token_reft(
    engine: Engine, name: str
) -> None:
    p = prompt(400, 20)
    got = engine.tokens([p], [engine.lora(name)], MAX_TOKENS)[0]
    assert got == expected(engine, name, p)
    base = expected(engine, None, p)
    all_tokens = reft_oracle.generate_reft(
        engine.model_dir, engine.adapters[name], p, MAX_TOKENS, all_tokens=True
    )
    assert got != base and got != all_tokens and base != all_tokens


@pytest.mark.parametrize("length", [1, 3, 5, 7])
def test_short_prompts_follow_pyreft_position_rule(engine: Engine, length: int) -> None:
    p = prompt(401 + length, length)
    for name in ("direft-f3l3", "loreft-l4"):
        assert engine.tokens([p], [engine.lora(name)], MAX_TOKENS)[0] == expected(engine, name, p)


def test_last_positions_in_a_later_chunk_than_first(engine: Engine) -> None:
    p = prompt(402, 2 * BATCH_TOKENS + 9)  # three chunks: f3 in the first, l3 in the last
    for name in ("direft-f3l3", "loreft-f2l2-shared", "direft-prefill"):
        assert engine.tokens([p], [engine.lora(name)], MAX_TOKENS)[0] == expected(engine, name, p)


def test_mixed_batch_of_reft_lora_and_base_beyond_max_loras(engine: Engine) -> None:
    names = [
        "direft-f3l3",
        None,
        "prefill-1",
        "loreft-f2l2-shared",
        "all-2",
        "direft-prefill",
        "loreft-l4",
        "direft-f3l3",
    ]
    assert len({n for n in names if n}) > MAX_LORAS
    prompts = [prompt(410 + i, 9 + 11 * i) for i in range(len(names))]
    got = engine.tokens(prompts, [engine.lora(n) for n in names], MAX_TOKENS)
    for name, p, tokens in zip(names, prompts, got):
        assert tokens == expected(engine, name, p), name


def test_prefix_cache_with_reft(engine: Engine) -> None:
    p = prompt(420, 3 * KV_BLOCK + 3)
    for name in ("direft-prefill", "direft-f3l3"):
        lora = engine.lora(name)
        first = engine.generate([p], [lora], MAX_TOKENS)[0]
        again = engine.generate([p], [lora], MAX_TOKENS)[0]
        assert again.num_cached_tokens >= 3 * KV_BLOCK, name
        assert list(again.outputs[0].token_ids) == list(first.outputs[0].token_ids)
        assert list(again.outputs[0].token_ids) == expected(engine, name, p)
    # A longer prompt with the same prefix: its "last" positions moved, so f/l ReFT blocks
    # must not be reused, while prompt-wide ReFT blocks can be.
    longer = p + prompt(421, 10)
    for name, reusable in (("direft-f3l3", False), ("direft-prefill", True)):
        out = engine.generate([longer], [engine.lora(name)], MAX_TOKENS)[0]
        assert (out.num_cached_tokens > 0) is reusable, name
        assert list(out.outputs[0].token_ids) == expected(engine, name, longer), name


def test_reft_adapters_free_their_slot_after_prefill(engine: Engine) -> None:
    names = list(REFT_SPECS)
    engine.settle(names)  # none held back while its adapter is parsed
    outs = engine.generate(
        [prompt(430 + i, 10) for i in range(len(names))], [engine.lora(n) for n in names], 24
    )
    assert max(o.metrics.scheduled_ts for o in outs) < min(o.metrics.last_token_ts for o in outs)
