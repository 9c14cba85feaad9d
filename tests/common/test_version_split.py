"""The canary split (``common.version_split``): its share of users matches the weight,
each user's pick is stable and agrees with an independent statement of the hash, and
weights outside (0, 1) or with more than four decimals are refused."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.common.registry_client import AdapterRef
from preft_serve.common.version_split import Variant, in_canary, pick, weight_units
from tests.support.canary_split import in_canary as reference

USERS = [f"user-{i}" for i in range(20_000)]


def _ref(version: int, canary: AdapterRef | None = None, weight: float = 0.0) -> AdapterRef:
    return AdapterRef(
        "acme",
        "bot",
        version,
        f"{version:064x}",
        AdapterType.LORA,
        AdapterMode.PREFILL,
        8,
        "tiny",
        canary=canary,
        canary_weight=weight,
    )


@pytest.mark.parametrize("weight", [0.0001, 0.01, 0.1, 0.5, 0.9, 0.9999])
def test_share_over_20k_users_is_within_binomial_bounds(weight: float) -> None:
    inside = sum(in_canary("bot", u, weight) for u in USERS)
    n = len(USERS)
    sigma = math.sqrt(n * weight * (1 - weight))
    assert abs(inside - n * weight) <= 5 * sigma + 1, (inside, n * weight)


@pytest.mark.parametrize("adapter", ["bot", "support.v2", "x"])
def test_each_users_pick_agrees_with_the_independent_hash(adapter: str) -> None:
    for user in USERS[:2000]:
        assert in_canary(adapter, user, 0.3) == reference(adapter, user, 0.3), user


def test_picks_are_stable_across_calls_and_processes() -> None:
    here = [in_canary("bot", u, 0.25) for u in USERS[:500]]
    assert here == [in_canary("bot", u, 0.25) for u in USERS[:500]]
    code = (
        "from preft_serve.common.version_split import in_canary\n"
        "print(''.join('1' if in_canary('bot', f'user-{i}', 0.25) else '0' for i in range(500)))"
    )
    # A fresh interpreter has another hash seed: Python's hash() would give other picks.
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345"},
    ).stdout.strip()
    assert other == "".join("1" if x else "0" for x in here)


def test_raising_the_weight_only_adds_users() -> None:
    small = {u for u in USERS if in_canary("bot", u, 0.1)}
    large = {u for u in USERS if in_canary("bot", u, 0.2)}
    assert small < large


def test_the_split_differs_between_adapters() -> None:
    a = {u for u in USERS if in_canary("bot", u, 0.5)}
    b = {u for u in USERS if in_canary("other", u, 0.5)}
    assert a != b


@pytest.mark.parametrize(
    ("weight", "says"),
    [
        (0, "strictly between 0 and 1"),
        (1, "strictly between 0 and 1"),
        (-0.5, "strictly between 0 and 1"),
        (0.12345, "more than 4 decimals"),
        (float("nan"), "strictly between 0 and 1"),
        ("abc", "is not a number"),
    ],
)
def test_bad_weights_are_refused_with_what_is_wrong(weight: float | str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        weight_units(weight)


def test_weight_units_are_exact() -> None:
    assert [weight_units(w) for w in (0.1, 0.0001, 0.9999, "0.25")] == [1000, 1, 9999, 2500]


def test_pick_without_a_canary_or_user_is_the_served_version() -> None:
    canary = _ref(2)
    split = _ref(1, canary, 0.5)
    assert pick(_ref(1), "anyone") == (_ref(1), Variant.SERVING)
    assert pick(split, None) == (split, Variant.SERVING)
    for user in USERS[:200]:
        chosen, variant = pick(split, user)
        if reference("bot", user, 0.5):
            assert (chosen, variant) == (canary, Variant.CANARY)
        else:
            assert (chosen, variant) == (split, Variant.SERVING)
