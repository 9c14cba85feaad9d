"""The two-pool benchmark tells a near tie from a wrong answer: answers that part where the
unified worker's top two choices are within float noise are recorded; any other difference
fails the run (``bench.disagg_bench.near_tie``, against a scripted gateway)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from bench import disagg_bench
from bench.stack_setup import BoundUser

USER = BoundUser("key", "u1", "a1", "0" * 64, "prefill")
UNIFIED, POOLS = [5, 6, 7, 8], [5, 6, 9, 9]


def scripted(
    monkeypatch: pytest.MonkeyPatch, top2: tuple[float, float], ids: list[int]
) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def post(url: str, json: dict[str, Any], **_: Any) -> httpx.Response:
        seen.append(json)
        steps = [{"x": -0.1, "y": -3.0}] * (len(ids) - 1) + [{"x": top2[0], "y": top2[1]}]
        body = {"choices": [{"token_ids": ids, "logprobs": {"top_logprobs": steps}}]}
        return httpx.Response(200, json=body, request=httpx.Request("POST", url))

    monkeypatch.setattr(disagg_bench.httpx, "post", post)
    return seen


def test_a_near_tie_is_recorded_with_its_step_and_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = scripted(monkeypatch, (-0.6931470, -0.6931485), UNIFIED[:3])
    tie = disagg_bench.near_tie("http://gw", USER, [1, 2], UNIFIED, POOLS)
    assert tie["step"] == 2 and tie["prompt_tokens"] == 2
    assert tie["top2_gap"] == pytest.approx(1.5e-6, rel=0.01)
    (asked,) = seen
    assert (asked["max_tokens"], asked["logprobs"], asked["temperature"]) == (3, 2, 0)


def test_a_clear_choice_that_differs_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted(monkeypatch, (-0.2, -1.9), UNIFIED[:3])
    with pytest.raises(RuntimeError, match="more than a near tie"):
        disagg_bench.near_tie("http://gw", USER, [1, 2], UNIFIED, POOLS)


def test_a_unified_answer_that_changed_on_asking_again_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scripted(monkeypatch, (-0.6931470, -0.6931485), [5, 4, 7])
    with pytest.raises(RuntimeError, match="asked again, the unified worker answered"):
        disagg_bench.near_tie("http://gw", USER, [1, 2], UNIFIED, POOLS)
