"""The trainer's loss for a fixed adapter equals an independent teacher-forced computation
with the serving semantics (tests/training/oracle.py), for every adapter kind; and PreFT's
loss differs from the all-token loss of the same weights (else the gate did nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.training.adapters import TrainableAdapter, attach_adapter
from preft_serve.training.batch import collate
from preft_serve.training.data import Example, tokenize_conversation
from preft_serve.training.loss import summed_nll
from preft_serve.training.spec import AdapterSpec
from preft_serve.training.trainer import pad_id
from tests.training import oracle

SPECS = {
    "lora-prefill": AdapterSpec(AdapterType.LORA, AdapterMode.PREFILL, rank=4),
    "lora-all": AdapterSpec(AdapterType.LORA, AdapterMode.ALL, rank=4),
    "direft-f3l3": AdapterSpec(AdapterType.DIREFT, rank=4, layers=(0, 1), positions="f3+l3"),
    "direft-prefill": AdapterSpec(AdapterType.DIREFT, rank=2, layers=(0,), positions="prefill"),
    "loreft-l4-shared": AdapterSpec(
        AdapterType.LOREFT, rank=4, layers=(1,), positions="l4", share_weights=True
    ),
    "loreft-f2l2": AdapterSpec(AdapterType.LOREFT, rank=4, layers=(0, 1), positions="f2+l2"),
}
CONVERSATIONS = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Name a fruit"},
        {"role": "assistant", "content": "A ripe mango."},
    ],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
]


@pytest.fixture(scope="module")
def examples(toy_tokenizer: Any) -> list[Example]:
    found = []
    for line, messages in enumerate(CONVERSATIONS, start=1):
        found += tokenize_conversation(toy_tokenizer, [{**m, "weight": 1} for m in messages], line)
    assert len(found) == 3  # one per assistant turn
    return found


def fixed_adapter(model_dir: Path, spec: AdapterSpec, seed: int) -> TrainableAdapter:
    """A trainer adapter whose every trainable tensor is random (not the identity init)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    adapter = attach_adapter(model, spec, seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return adapter


def trainer_nll(adapter: TrainableAdapter, examples: list[Example], pad: int) -> list[float]:
    batch = collate(examples, pad)  # padded together: padding must not change anything
    with torch.no_grad():
        total = float(summed_nll(adapter, batch))
        each = [float(summed_nll(adapter, collate([e], pad))) for e in examples]
    assert total == pytest.approx(sum(each), rel=1e-5)
    return each


@pytest.mark.parametrize("name", sorted(SPECS))
def test_trainer_loss_equals_teacher_forced_oracle(
    name: str, toy_model: Path, toy_tokenizer: Any, examples: list[Example], tmp_path: Path
) -> None:
    spec = SPECS[name]
    adapter = fixed_adapter(toy_model, spec, seed=7)
    got = trainer_nll(adapter, examples, pad_id(toy_tokenizer))
    adapter.save(tmp_path, str(toy_model))  # the oracle reads the saved adapter
    if spec.type is AdapterType.LORA:
        want = [
            oracle.lora_nll(toy_model, tmp_path, list(e.prompt), list(e.response), spec.mode.value)
            for e in examples
        ]
    else:
        want = [
            oracle.reft_nll(toy_model, tmp_path, list(e.prompt), list(e.response)) for e in examples
        ]
    assert got == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_prefill_loss_differs_from_all_token_loss_of_the_same_weights(
    toy_model: Path, toy_tokenizer: Any, examples: list[Example]
) -> None:
    pad = pad_id(toy_tokenizer)
    prefill = trainer_nll(fixed_adapter(toy_model, SPECS["lora-prefill"], 7), examples, pad)
    all_tokens = trainer_nll(fixed_adapter(toy_model, SPECS["lora-all"], 7), examples, pad)
    off = fixed_adapter(toy_model, SPECS["lora-prefill"], 7)
    with torch.no_grad():
        off.set_batch(None)
        base = [float(_base_nll(off, e, pad)) for e in examples]
    for p, a, b in zip(prefill, all_tokens, base):
        assert abs(p - a) > 0.1 and abs(p - b) > 0.1 and abs(a - b) > 0.1, (p, a, b)


def _base_nll(adapter: TrainableAdapter, example: Example, pad: int) -> torch.Tensor:
    """The same loss with the adapter off everywhere (the frozen base model)."""
    batch = collate([example], pad)
    logits = adapter.causal_lm(input_ids=batch.input_ids).logits[0, :-1]
    start = len(example.prompt) - 1
    return torch.nn.functional.cross_entropy(
        logits[start:], batch.input_ids[0, start + 1 :], reduction="sum"
    )
