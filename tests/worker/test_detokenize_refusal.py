"""The worker's own check of ``/detokenize`` (the gateway checks too; a worker reached
directly must not answer 200 with empty text for ids no completion would accept)."""

from __future__ import annotations

import pytest

from preft_serve.worker.vllm_compat.tokenization import detokenize_refusal


def test_ids_inside_the_vocabulary_and_context_pass() -> None:
    assert detokenize_refusal([0, 5, 319], max_model_len=8, vocab_size=320) is None


@pytest.mark.parametrize("bad", [320, 10**9, -1])
def test_an_id_outside_the_vocabulary_is_named(bad: int) -> None:
    refusal = detokenize_refusal([1, bad, 2], max_model_len=8, vocab_size=320)
    assert refusal == (
        f"token id {bad} is outside the vocabulary of 320 tokens; token ids run from 0 to 319"
    )


def test_more_ids_than_the_context_are_refused_before_any_lookup() -> None:
    refusal = detokenize_refusal([10**9] * 9, max_model_len=8, vocab_size=320)
    assert refusal is not None and refusal.startswith("'tokens' holds 9 token ids")
    assert "send at most 8" in refusal


def test_an_unknown_vocabulary_checks_only_the_length() -> None:
    assert detokenize_refusal([10**9], max_model_len=8, vocab_size=None) is None
