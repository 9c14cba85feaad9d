"""PreFT under KV-cache pressure: preempted requests recompute prompt and output correctly.

vLLM preempts a running request when the KV cache is full: it frees the request's blocks,
puts it back in the waiting queue and later recomputes prompt *and* generated tokens in
one prefill. A prefill-only adapter must then apply to the prompt positions only (the
generated ones were decoded by the base model), the request needs an adapter slot again
(the scheduler had stopped counting it), and blocks the prefix cache kept from before the
preemption may be reused only where their tokens were computed the same way. This engine
has room for ~2.5 requests' KV while six run, so preemptions are certain; every answer
must still equal the HF+peft oracle's. With the prefix cache on, a preempted request finds
its own blocks again (the adapter-keyed ones of its prompt, and the one that holds both
prompt and generated tokens); with it off, it recomputes everything, prompt with adapter.
(Checked by breaking it: applying the adapter to the recomputed generated tokens fails
here; the scheduler losing a preempted request's adapter stalls the engine, which the
suite's timeout reports. The worker maps tokens from its own copy of the request's
adapter, so a resumed request keeps it there.)
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine import oracle
from tests.support.engine import KV_BLOCK, Engine, prompt, scheduler_of

PROMPT_TOKENS = 40
OUTPUT_TOKENS = 48  # prompt + output = 88 tokens = 3 blocks of 32
KV_BLOCKS = 8  # for six requests that need 18
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4  # K and V x 2 layers x 2 KV heads x dim 32 x fp32


@pytest.fixture(scope="session")
def small_kv_engines(engines: dict[str, Engine]) -> dict[bool, Engine]:
    """tiny-llama with the shared engines' adapters, but a KV cache of 8 blocks; one with
    the prefix cache, one without. They live as long as the session's other engines: an
    in-process vLLM engine that shuts down takes vLLM's process-wide parallel state with
    it, and the engines still running would fail on their next step."""
    from vllm import LLM

    from preft_serve.worker.engine_config import preft_engine_kwargs

    shared = engines["tiny-llama"]
    built = {}
    for prefix_cache in (True, False):
        llm = LLM(
            model=str(shared.model_dir),
            dtype="float32",
            enforce_eager=True,
            max_loras=2,
            max_cpu_loras=4,
            max_lora_rank=8,
            kv_cache_memory_bytes=KV_BLOCKS * KV_BLOCK * KV_BYTES_PER_TOKEN,
            distributed_executor_backend="uni",
            max_model_len=4 * KV_BLOCK,
            max_num_seqs=8,
            max_num_batched_tokens=128,
            enable_prefix_caching=prefix_cache,
            block_size=KV_BLOCK,
            seed=0,
            disable_log_stats=False,
            **preft_engine_kwargs(),
        )
        built[prefix_cache] = Engine(llm, shared.model_dir, shared.adapters)
    return built


@pytest.fixture(params=[True, False], ids=["prefix-cache", "no-prefix-cache"])
def small_kv_engine(request: pytest.FixtureRequest, small_kv_engines: dict[bool, Engine]) -> Engine:
    return small_kv_engines[request.param]


def _record_preemptions(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[tuple[int, ...], int, int]]:
    """(prompt, computed tokens, prompt tokens) of every request the scheduler preempts.
    (vLLM's preemption counter is no help here: with several engines in one process, its
    Prometheus metrics are those of the engine made last.)"""
    scheduler = scheduler_of(engine.llm)
    preempt = scheduler._preempt_request
    seen: list[tuple[tuple[int, ...], int, int]] = []

    def recording(request: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(
            (
                tuple(request.prompt_token_ids),
                request.num_computed_tokens,
                request.num_prompt_tokens,
            )
        )
        preempt(request, *args, **kwargs)

    monkeypatch.setattr(scheduler, "_preempt_request", recording)
    return seen


def _expected(engine: Engine, name: str | None, tokens: list[int]) -> list[int]:
    if name is None:
        return oracle.generate_base(engine.model_dir, tokens, OUTPUT_TOKENS)
    generate = oracle.generate_prefill if name.startswith("prefill") else oracle.generate_all
    return generate(engine.model_dir, engine.adapters[name], tokens, OUTPUT_TOKENS)


def test_preempted_requests_match_oracle(
    small_kv_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = small_kv_engine
    blocks = engine.llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
    assert blocks is not None and blocks < 18, blocks  # the cache cannot hold all six
    # vLLM preempts the request that arrived last, so the prefill-only ones come last:
    # they are preempted while decoding, when the scheduler no longer counts their slot.
    names = [None, "all-1", "prefill-1", "prefill-2", "prefill-3", "prefill-1"]
    # Request 5 repeats request 2's adapter and prompt: prefix-cache hits across requests.
    prompts = [prompt(300 + i, PROMPT_TOKENS) for i in range(5)] + [prompt(302, PROMPT_TOKENS)]
    engine.settle(names)  # the batch starts whole: preemptions are certain
    preempted = _record_preemptions(engine, monkeypatch)

    got = engine.tokens(prompts, [engine.lora(n) for n in names], OUTPUT_TOKENS)

    name_of = {tuple(p): n for p, n in zip(prompts, names)}
    assert any(
        (name_of[p] or "").startswith("prefill") and computed > prompt_len
        for p, computed, prompt_len in preempted
    ), preempted
    for i, (name, p, tokens) in enumerate(zip(names, prompts, got)):
        assert tokens == _expected(engine, name, p), (i, name)
    assert got[2] == got[5]


def test_engine_serves_normally_after_preemptions(small_kv_engine: Engine) -> None:
    """What the cache kept through the preemptions must not leak into a later answer:
    the same prompt under another adapter, and under the base model, after them."""
    p = prompt(302, PROMPT_TOKENS)
    names = ["prefill-4", None]
    got = small_kv_engine.tokens([p, p], [small_kv_engine.lora(n) for n in names], OUTPUT_TOKENS)
    assert got == [_expected(small_kv_engine, n, p) for n in names]
    assert got[0] != got[1]
