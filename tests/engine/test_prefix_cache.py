"""Prefix caching stays on and is keyed by adapter content (sha256), never by name."""

from __future__ import annotations

import shutil
from pathlib import Path

from preft_serve.adapters.format import AdapterMode
from preft_serve.toymodels import LoraSpec, make_lora_adapter
from tests.engine import oracle
from tests.support.engine import KV_BLOCK as BLOCK
from tests.support.engine import MAX_TOKENS, Engine, prompt


def run(
    engine: Engine, tokens: list[int], lora, max_tokens: int = MAX_TOKENS
) -> tuple[list[int], int]:
    out = engine.generate([tokens], [lora], max_tokens)[0]
    return list(out.outputs[0].token_ids), out.num_cached_tokens


def test_repeat_prompt_hits_cache_and_stays_exact(engine: Engine) -> None:
    p = prompt(100, 3 * BLOCK + 5)
    want = oracle.generate_prefill(engine.model_dir, engine.adapters["prefill-1"], p, MAX_TOKENS)
    first, cached_first = run(engine, p, engine.lora("prefill-1"))
    second, cached_second = run(engine, p, engine.lora("prefill-1"))
    assert cached_first == 0 and cached_second >= 3 * BLOCK
    assert first == second == want


def test_other_adapter_mode_or_base_never_reuse_prompt_kv(engine: Engine) -> None:
    p = prompt(101, 3 * BLOCK + 5)
    run(engine, p, engine.lora("prefill-2"))
    for name in ("prefill-3", "all-2", None):  # all-2 has prefill-2's weights, other mode
        _, cached = run(engine, p, engine.lora(name))
        assert cached == 0, name


def test_identical_content_under_another_name_and_path_shares_blocks(
    engine: Engine, tmp_path: Path
) -> None:
    p = prompt(102, 3 * BLOCK + 5)
    run(engine, p, engine.lora("prefill-4"))
    twin = shutil.copytree(engine.adapters["prefill-4"], tmp_path / "twin")
    tokens, cached = run(engine, p, engine.lora("twin-of-prefill-4", twin))
    assert cached >= 3 * BLOCK
    assert tokens == oracle.generate_prefill(engine.model_dir, twin, p, MAX_TOKENS)


def test_new_version_under_same_name_and_path_never_reuses_stale_kv(
    engine: Engine, tmp_path: Path
) -> None:
    p = prompt(103, 3 * BLOCK + 5)
    path = make_lora_adapter(
        engine.model_dir,
        tmp_path / "mutable",
        seed=50,
        spec=LoraSpec(rank=8, mode=AdapterMode.PREFILL),
    )
    v1, _ = run(engine, p, engine.fresh_lora("mutable", path))
    make_lora_adapter(
        engine.model_dir,
        path,
        seed=51,  # same name, same path, new weights
        spec=LoraSpec(rank=8, mode=AdapterMode.PREFILL),
    )
    v2, cached = run(engine, p, engine.fresh_lora("mutable", path))
    assert cached == 0
    assert v2 == oracle.generate_prefill(engine.model_dir, path, p, MAX_TOKENS)
    assert v2 != v1


def test_follow_up_prompt_recomputes_generated_tokens_with_the_adapter(engine: Engine) -> None:
    """Multi-turn chat: the next prompt contains the previous reply. Those tokens were decoded
    by the base model, but as prompt tokens they must get the adapter, so their cached KV
    blocks must not be reused (only blocks made purely of prompt tokens are)."""
    first_prompt = prompt(104, 2 * BLOCK + 5)
    reply, _ = run(engine, first_prompt, engine.lora("prefill-1"), max_tokens=40)
    follow_up = first_prompt + reply  # block 2 holds 5 prompt + 27 generated tokens
    tokens, cached = run(engine, follow_up, engine.lora("prefill-1"))
    assert cached == 2 * BLOCK
    assert tokens == oracle.generate_prefill(
        engine.model_dir, engine.adapters["prefill-1"], follow_up, MAX_TOKENS
    )
