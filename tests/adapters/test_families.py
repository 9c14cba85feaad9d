"""Adapter families: every type has one, and each ReFT family's intervention is the
formula docs/adapters.md gives for it."""

from __future__ import annotations

import numpy as np
import pytest

from preft_serve.adapters.families import Runtime, families, family_of
from preft_serve.adapters.format import AdapterType, adapter_type
from preft_serve.registry.validation import get_validator


def test_every_type_has_a_family_and_a_validator() -> None:
    assert {f.type for f in families()} == set(AdapterType)
    for family in families():
        assert get_validator(family.type).type is family.type
        config = {"peft_type": family.peft_type, "reft_type": family.type.value}
        assert adapter_type(config) is family.type
        assert family.prompt_only is (family.runtime is Runtime.REFT)


@pytest.mark.parametrize("kind", [AdapterType.DIREFT, AdapterType.LOREFT])
def test_reft_intervention_is_the_documented_formula(kind: AdapterType) -> None:
    rng = np.random.default_rng(0)
    rank, hidden = 3, 8
    family = family_of(kind)
    assert family.intervention is not None
    tensors = {
        s: rng.normal(size=(rank, hidden) if shape == "rd" else (rank,))
        for s, shape in family.reft_tensors.items()
    }
    h = rng.normal(size=hidden)
    proj_in, bias, proj_out = family.intervention(tensors)
    delta = (h @ proj_in.T + bias) @ proj_out
    if kind is AdapterType.DIREFT:  # h + W2ᵀ(W1·h + b)
        expected = tensors["w2"].T @ (tensors["w1"] @ h + tensors["b"])
    else:  # h + Rᵀ(W·h + b − R·h)
        r = tensors["r"]
        expected = r.T @ (tensors["w"] @ h + tensors["b"] - r @ h)
    np.testing.assert_allclose(delta, expected)
