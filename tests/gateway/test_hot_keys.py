"""HotKeys: decayed shares of the recent requests, in bounded memory."""

from __future__ import annotations

import pytest

from preft_serve.gateway.hot_keys import HotKeys


def test_share_follows_the_recent_requests() -> None:
    hot = HotKeys(window=1000)
    for i in range(5000):
        hot.add("hot" if i % 10 == 0 else f"cold{i}")
    assert hot.share("hot") == pytest.approx(0.1, rel=0.05)
    assert hot.share("cold4999") == pytest.approx(1 / 1000, rel=0.01)
    assert hot.share("never") == 0.0


def test_share_decays_when_a_key_stops() -> None:
    hot = HotKeys(window=1000)
    for i in range(8000):
        hot.add("hot" if i % 2 == 0 else f"cold{i}")
    assert hot.share("hot") == pytest.approx(0.5, rel=0.05)
    for i in range(1000):  # one window without it: e^-1 of what it had
        hot.add(f"later{i}")
    assert hot.share("hot") == pytest.approx(0.5 / 2.718, rel=0.05)
    for i in range(3000):
        hot.add(f"later{i}")
    assert hot.share("hot") < 0.01


def test_a_fresh_tracker_under_estimates_rather_than_replicating_everything() -> None:
    hot = HotKeys(window=1000)
    assert hot.add("first") == pytest.approx(1 / 1000, rel=0.01)
    for _ in range(9):
        hot.add("first")
    assert hot.share("first") == pytest.approx(10 / 1000, rel=0.01)


def test_memory_is_bounded_and_pruning_keeps_the_hot_keys() -> None:
    hot = HotKeys(window=4096, size=64)
    for i in range(200_000):
        hot.add(f"hot{i % 5}" if i % 4 == 0 else f"cold{i}")
        assert len(hot.counts) <= 2 * 64
    for k in range(5):
        assert hot.share(f"hot{k}") == pytest.approx(0.05, rel=0.15)


def test_weights_are_rescaled_before_they_overflow() -> None:
    hot = HotKeys(window=2, size=4)  # each request weighs twice the one before
    for i in range(2000):
        hot.add("a" if i % 2 else "b")
    assert hot.share("a") + hot.share("b") == pytest.approx(1.0)
    assert hot.share("a") == pytest.approx(2 / 3, rel=0.01)  # the last request weighs most
