"""PreFT token->adapter mapping (pure numpy), the contract of ARCHITECTURE.md."""

from __future__ import annotations

import numpy as np

from preft_serve.worker.token_mapping import step_mapping


def test_prefill_adapter_covers_every_prompt_token_across_chunks_then_stops() -> None:
    # One request (adapter 7, prompt of 10) scheduled as chunks 4, 4, 2, then decode 1, 1.
    computed = 0
    seen = []
    for chunk in (4, 4, 2, 1, 1):
        m = step_mapping([7], [True], [computed], [10], [chunk], [1])
        seen.append((m.token_ids.tolist(), m.sampled_ids.tolist(), m.active_ids()))
        computed += chunk
    assert seen == [
        ([7, 7, 7, 7], [7], {7}),
        ([7, 7, 7, 7], [7], {7}),
        ([7, 7], [7], {7}),  # the last prompt token samples the first output token
        ([0], [0], set()),  # decode: base model, no slot needed
        ([0], [0], set()),
    ]


def test_all_mode_adapter_covers_decode_tokens_too() -> None:
    m = step_mapping([3], [False], [12], [10], [1], [1])
    assert m.token_ids.tolist() == [3] and m.sampled_ids.tolist() == [3]


def test_mixed_batch_of_base_prefill_and_all_requests() -> None:
    m = step_mapping(
        adapter_ids=np.array([0, 5, 6, 5]),
        prefill_only=np.array([False, True, False, True]),
        num_computed=np.array([3, 20, 20, 2]),
        num_prompt=np.array([3, 20, 8, 4]),
        num_scheduled=np.array([1, 1, 1, 3]),  # last request: prompt tail 2 + (recompute) 1
        num_sampled=np.array([1, 1, 1, 1]),
    )
    assert m.token_ids.tolist() == [0, 0, 6, 5, 5, 0]
    assert m.sampled_ids.tolist() == [0, 0, 6, 0]
    assert m.active_ids() == {5, 6}


def test_preempted_request_recomputes_prompt_with_adapter_and_outputs_without() -> None:
    # After preemption the prompt (6) and 3 generated tokens are recomputed in one chunk.
    m = step_mapping([9], [True], [0], [6], [9], [1])
    assert m.token_ids.tolist() == [9] * 6 + [0] * 3
    assert m.sampled_ids.tolist() == [0]


def test_step_without_adapter_tokens_activates_nothing() -> None:
    m = step_mapping([4, 5], [True, True], [30, 31], [10, 12], [1, 1], [1, 1])
    assert m.active_ids() == set() and not m.token_ids.any()
