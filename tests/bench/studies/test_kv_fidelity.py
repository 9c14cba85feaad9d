"""The KV-fidelity study's comparison (``bench.studies.kv_fidelity``), against scripted
workers: equal paths give no difference, a near-equal one its float-sized difference, and
answers that part say where and how close the unified worker's top two were there."""

from __future__ import annotations

from typing import Any

import pytest

from bench.studies import kv_fidelity

PREFILL, DECODE = "http://prefill", "http://decode"


def choice(ids: list[int], logprobs: list[float], gaps: list[float]) -> dict[str, Any]:
    tops = [{"a": lp, "b": lp - gap} for lp, gap in zip(logprobs, gaps, strict=True)]
    return {"token_ids": ids, "logprobs": {"token_logprobs": logprobs, "top_logprobs": tops}}


def scripted(monkeypatch: pytest.MonkeyPatch, decoded: dict[str, Any]) -> list[dict[str, Any]]:
    """The unified answer is tokens 7, 8, 9; the pools' first token is 7, the rest
    ``decoded``."""
    sent: list[dict[str, Any]] = []

    def complete(url: str, body: dict[str, Any]) -> dict[str, Any]:
        sent.append({"url": url, **body})
        if url == DECODE:
            return {"choices": [decoded]}
        if body["max_tokens"] == 1:
            return {
                "choices": [choice([7], [-0.5], [0.3])],
                "kv_transfer_params": {"remote_block_ids": [1]},
            }
        return {"choices": [choice([7, 8, 9], [-0.5, -0.7, -0.9], [0.3, 0.2, 2e-6])]}

    monkeypatch.setattr(kv_fidelity, "complete", complete)
    return sent


def test_the_same_answer_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = scripted(monkeypatch, choice([8, 9], [-0.7 + 1e-6, -0.9], [0.2, 2e-6]))
    record = kv_fidelity.one_pair(PREFILL, DECODE, "base", "sha256:x", [1, 2, 3], 3)
    assert record["handed_off"] and record["parted_at"] is None
    assert record["max_logprob_diff"] == pytest.approx(1e-6, rel=0.01)
    assert record["min_top2_gap"] == pytest.approx(2e-6)
    decode_hop = sent[-1]
    assert decode_hop["prompt"] == [1, 2, 3, 7] and decode_hop["max_tokens"] == 2
    assert decode_hop["kv_transfer_params"] == {"remote_block_ids": [1]}
    assert decode_hop["model"] == "base"


def test_answers_that_part_say_where_and_how_close_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted(monkeypatch, choice([8, 4], [-0.7, -0.9], [0.2, 1e-6]))
    record = kv_fidelity.one_pair(PREFILL, DECODE, "base", "sha256:x", [1, 2, 3], 3)
    assert record["parted_at"] == 2
    assert record["top2_gap_where_parted"] == pytest.approx(2e-6)
    assert record["max_logprob_diff"] == 0.0  # over the steps before they parted
    summary = kv_fidelity.summary([record])
    assert (summary["pairs"], summary["parted"]) == (1, 1) and summary["all_handed_off"]
