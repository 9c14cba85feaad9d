"""PreFT correctness: vLLM's greedy tokens equal the HF+peft oracle exactly (float32)."""

from __future__ import annotations

import pytest

from tests.engine import oracle
from tests.support.engine import BATCH_TOKENS, MAX_LORAS, MAX_TOKENS, Engine, prompt


def expected(engine: Engine, name: str | None, tokens: list[int]) -> list[int]:
    if name is None:
        return oracle.generate_base(engine.model_dir, tokens, MAX_TOKENS)
    generate = oracle.generate_prefill if name.startswith("prefill") else oracle.generate_all
    return generate(engine.model_dir, engine.adapters[name], tokens, MAX_TOKENS)


def test_base_all_prefill_match_oracle_and_differ(engine: Engine) -> None:
    p = prompt(1, 24)
    names = [None, "all-1", "prefill-1"]
    got = [engine.tokens([p], [engine.lora(n)], MAX_TOKENS)[0] for n in names]
    want = [expected(engine, n, p) for n in names]
    assert got == want
    base, all_tokens, prefill = got
    assert base != all_tokens and base != prefill and all_tokens != prefill
    # Mode "all" is plain PeftModel.generate (which may stop early at EOS).
    hf = oracle.peft_generate(engine.model_dir, engine.adapters["all-1"], p, MAX_TOKENS)
    assert hf and all_tokens[: len(hf)] == hf
    # PreFT's first token comes from the adapted prompt, so it matches mode "all"...
    assert prefill[0] == all_tokens[0]
    # ...and everything after is decoded by the base model.
    assert prefill[1:] != all_tokens[1:]


@pytest.mark.parametrize("name", ["prefill-2", "all-2"])
def test_prompt_longer_than_chunked_prefill_budget(engine: Engine, name: str) -> None:
    p = prompt(2, 3 * BATCH_TOKENS + 7)  # four chunks; the last prompt token in the last one
    assert engine.tokens([p], [engine.lora(name)], MAX_TOKENS)[0] == expected(engine, name, p)


def test_more_distinct_adapters_than_slots_in_one_mixed_batch(engine: Engine) -> None:
    names = [None, "prefill-1", "prefill-2", "prefill-3", "prefill-4", "all-3", None, "all-4"]
    assert len({n for n in names if n}) > MAX_LORAS
    prompts = [prompt(10 + i, 12 + 9 * i) for i in range(len(names))]  # some chunked
    got = engine.tokens(prompts, [engine.lora(n) for n in names], MAX_TOKENS)
    for name, p, tokens in zip(names, prompts, got):
        assert tokens == expected(engine, name, p), name


def test_same_prompt_different_adapters_in_one_batch(engine: Engine) -> None:
    """One prompt under four adapters at once: prompt KV must never be shared."""
    p = prompt(3, 40)
    names = ["prefill-1", "prefill-2", "all-1", None]
    got = engine.tokens([p] * 4, [engine.lora(n) for n in names], MAX_TOKENS)
    assert got == [expected(engine, n, p) for n in names]
    assert len({tuple(t) for t in got}) == 4


def test_adapters_of_smaller_ranks_and_other_targets_sharing_slots(
    engine: Engine, tmp_path
) -> None:
    """Ranks below ``max_lora_rank`` (8) fill only part of a slot, and adapters on other
    modules leave the rest of the model's slots at zero: the slot writes that skip zeroing
    (``lora_layers.SlotState``) must still clear what the slot's last adapter left there.
    Mixed in one batch with more adapters than slots, each matches the oracle."""
    from preft_serve.toymodels import LoraSpec, make_lora_adapter
    from preft_serve.toymodels.adapters import ATTENTION_MODULES, MLP_MODULES

    specs = {
        "r2-attn": LoraSpec(rank=2),
        "r4-qv": LoraSpec(rank=4, target_modules=("q_proj", "v_proj")),
        "r8-all": LoraSpec(rank=8, target_modules=ATTENTION_MODULES + MLP_MODULES),
        "r4-mlp": LoraSpec(rank=4, target_modules=MLP_MODULES),
    }
    folders = {
        name: make_lora_adapter(engine.model_dir, tmp_path / name, seed=900 + i, spec=spec)
        for i, (name, spec) in enumerate(specs.items())
    }
    names = ["r8-all", "r2-attn", "r4-qv", "r4-mlp", "r8-all", "r4-qv"]
    assert len(set(names)) > MAX_LORAS
    prompts = [prompt(60 + i, 14 + 5 * i) for i in range(len(names))]
    loras = [engine.fresh_lora(f"mixed-{n}", folders[n]) for n in names]
    got = engine.tokens(prompts, loras, MAX_TOKENS)
    for name, p, tokens in zip(names, prompts, got):
        assert tokens == oracle.generate_prefill(engine.model_dir, folders[name], p, MAX_TOKENS), (
            name
        )
    # One by one too, in an order where each slot's last adapter was a larger one.
    for name in ["r8-all", "r2-attn", "r4-mlp", "r4-qv"]:
        p = prompt(80, 20)
        lora = engine.fresh_lora(f"alone-{name}", folders[name])
        assert engine.tokens([p], [lora], MAX_TOKENS)[0] == oracle.generate_prefill(
            engine.model_dir, folders[name], p, MAX_TOKENS
        ), name
