"""The one JSON nesting-depth check (registry bodies and configs, gateway requests, trainer
JSONL lines) against the parser's own idea of depth."""

from __future__ import annotations

import json
import random

import pytest

from preft_serve.common.jsondepth import json_depth, json_nests_deeper


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _random_value(rng: random.Random, depth: int) -> object:
    kind = rng.choice("lds" if depth < 8 else "s")
    if kind == "l":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "d":
        return {
            rng.choice(['k"[', "k\\", "{]}", "k"]) + str(i): _random_value(rng, depth + 1)
            for i in range(rng.randint(0, 3))
        }
    return rng.choice(['"[{"', "\\", '\\"[', "]]}}", "x", "\\\\[", "é[", 1, None, 2.5])


@pytest.mark.parametrize("seed", range(200))
def test_depth_of_valid_json_is_the_parsers(seed: int) -> None:
    value = _random_value(random.Random(seed), 0)
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=1)):
        assert json_depth(text.encode()) == json_depth(text) == _depth(value)
        assert not json_nests_deeper(text, _depth(value))
        if _depth(value):
            assert json_nests_deeper(text, _depth(value) - 1)


def test_bombs_are_measured_without_parsing() -> None:
    assert json_depth(b"[" * 100_000) == 100_000
    assert json_nests_deeper(b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}", 32)
    assert not json_nests_deeper(b'["' + b"[" * 100 + b'"]', 32)  # brackets in a string
