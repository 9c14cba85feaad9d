"""The load test's Zipf popularity (``--zipf S``): the sampler draws the shares it states."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from bench.popularity import Zipf, ranks, shares, top_share


def test_ranks_are_a_seeded_permutation() -> None:
    assert sorted(ranks(50, 3)) == list(range(1, 51))
    assert ranks(50, 3) == ranks(50, 3)
    assert ranks(50, 3) != ranks(50, 4)


def test_shares_follow_the_ranks() -> None:
    n, s = 2000, 1.2
    got = shares(n, s, seed=7)
    assert sum(got) == pytest.approx(1.0)
    by_rank = sorted(zip(ranks(n, 7), got, strict=True))
    assert by_rank[0][1] == pytest.approx(top_share(n, s))
    assert top_share(n, s) == pytest.approx(0.2223, abs=1e-4)
    assert by_rank[1][1] / by_rank[0][1] == pytest.approx(2**-s)


def test_zero_is_uniform() -> None:
    assert shares(10, 0.0) == pytest.approx([0.1] * 10)


def test_draws_match_the_shares() -> None:
    n, s, draws = 200, 1.2, 100_000
    zipf = Zipf(n, s, seed=1)
    rng = random.Random(0)
    counts = Counter(zipf.pick(rng) for _ in range(draws))
    expected = shares(n, s, seed=1)
    top = sorted(range(n), key=lambda i: -expected[i])[:10]
    for i in top:  # within 4 standard deviations of the binomial count
        sd = (draws * expected[i] * (1 - expected[i])) ** 0.5
        assert abs(counts[i] - draws * expected[i]) < 4 * sd
    assert set(counts) <= set(range(n))


def test_seeded_draws_repeat() -> None:
    zipf = Zipf(100, 1.0, seed=2)
    a, b, c = random.Random("0:1"), random.Random("0:1"), random.Random("0:2")
    first = [zipf.pick(a) for _ in range(20)]
    assert first == [zipf.pick(b) for _ in range(20)]
    assert first != [zipf.pick(c) for _ in range(20)]


def test_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        Zipf(0, 1.0, 0)
    with pytest.raises(ValueError):
        Zipf(10, -1.0, 0)
