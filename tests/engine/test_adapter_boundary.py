"""The adapter boundary: tokens before it get the prefill-only adapter, tokens from it on
run on the base model over the adapted KV. Prompt log-probs of prompt + answer with the
boundary at the prompt's end are PreFT's teacher-forced log-probs (HF+peft oracle), which
the evaluation gate's ``loss`` metric scores; without it the adapter covers the answer too."""

from __future__ import annotations

import math
from typing import Any

import pytest

from preft_serve.common.adapter_boundary import ADAPTER_TOKENS_XARG
from tests.engine import oracle
from tests.support.engine import BATCH_TOKENS, KV_BLOCK, Engine, prompt
from tests.training import oracle as loss_oracle

TOL = 1e-3  # float32 engine vs float64 log-softmax over float32 logits


def scored(
    engine: Engine, tokens: list[int], name: str, boundary: int | None, max_tokens: int = 1
) -> Any:
    from vllm import SamplingParams

    params = SamplingParams(
        temperature=0.0,
        max_tokens=max_tokens,
        ignore_eos=True,
        prompt_logprobs=0,
        extra_args=None if boundary is None else {ADAPTER_TOKENS_XARG: boundary},
    )
    return engine.llm.generate(
        [{"prompt_token_ids": tokens}], params, lora_request=[engine.lora(name)], use_tqdm=False
    )[0]


def answer_logprobs(out: Any, tokens: list[int], start: int) -> list[float]:
    """The engine's log-prob of each token from ``start`` on (vLLM's first entry is None)."""
    rows = out.prompt_logprobs
    return [rows[i][tokens[i]].logprob for i in range(start, len(tokens))]


def test_boundary_at_prompt_end_gives_preft_teacher_forced_logprobs(engine: Engine) -> None:
    p, a = prompt(301, 40), prompt(302, 30)  # 70 tokens: a chunk boundary inside the answer
    assert len(p) + len(a) > BATCH_TOKENS
    adapter = engine.adapters["prefill-1"]
    preft = answer_logprobs(scored(engine, p + a, "prefill-1", len(p)), p + a, len(p))
    want = oracle.answer_logprobs(engine.model_dir, adapter, p, a, "prefill")
    assert preft == pytest.approx(want, abs=TOL)
    # Without a boundary the adapter covers the answer too: the all-token log-probs.
    whole = answer_logprobs(scored(engine, p + a, "prefill-1", None), p + a, len(p))
    all_tokens = oracle.answer_logprobs(engine.model_dir, adapter, p, a, "all")
    assert whole == pytest.approx(all_tokens, abs=TOL)
    assert max(abs(x - y) for x, y in zip(preft, whole)) > 0.1
    # A boundary past the prompt's end changes nothing.
    past = answer_logprobs(scored(engine, p + a, "prefill-1", 10_000), p + a, len(p))
    assert past == pytest.approx(whole, abs=TOL)


def test_boundary_with_reft_positions_counts_from_the_boundary(engine: Engine) -> None:
    """ReFT's last-n positions are the last n tokens before the boundary."""
    p, a = prompt(303, 20), prompt(304, 12)
    name = "direft-f3l3"
    out = scored(engine, p + a, name, len(p))
    got = -math.fsum(answer_logprobs(out, p + a, len(p)))
    want = loss_oracle.reft_nll(engine.model_dir, engine.adapters[name], p, a)
    assert got == pytest.approx(want, abs=TOL * len(a))


def bounded(engine: Engine, tokens: list[int], name: str, boundary: int) -> Any:
    """A greedy completion of ``tokens`` with the adapter up to ``boundary`` only."""
    from vllm import SamplingParams

    params = SamplingParams(
        temperature=0.0, max_tokens=4, ignore_eos=True, extra_args={ADAPTER_TOKENS_XARG: boundary}
    )
    return engine.llm.generate(
        [{"prompt_token_ids": tokens}], params, lora_request=[engine.lora(name)], use_tqdm=False
    )[0]


def test_blocks_past_the_boundary_are_never_shared_with_adapted_ones(engine: Engine) -> None:
    """KV past the boundary is base-model KV: a request whose adapter covers those tokens
    reuses only the blocks before the boundary, and so does the reverse; requests with the
    same boundary share every block."""
    b = KV_BLOCK + 7
    shared = (b // KV_BLOCK) * KV_BLOCK  # blocks wholly before the boundary
    name = "prefill-2"
    full = prompt(305, 3 * KV_BLOCK + 9)
    assert bounded(engine, full, name, b).num_cached_tokens == 0
    plain = engine.generate([full], [engine.lora(name)], 4)[0]
    assert plain.num_cached_tokens == shared
    want = oracle.generate_prefill(engine.model_dir, engine.adapters[name], full, 4)
    assert list(plain.outputs[0].token_ids) == want

    other = prompt(306, 3 * KV_BLOCK + 9)
    assert engine.generate([other], [engine.lora(name)], 4)[0].num_cached_tokens == 0
    first = bounded(engine, other, name, b)
    assert first.num_cached_tokens == shared
    again = bounded(engine, other, name, b)
    assert again.num_cached_tokens >= 3 * KV_BLOCK
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
