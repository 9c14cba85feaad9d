"""Adapters trained by ``preft train``'s trainer, served by the real engine.

For each adapter kind, train on a tiny memorisation set with the toy model: the loss falls
below a threshold, and the engine's greedy answer is the target answer, token for token
equal to the HF oracle of the trained adapter (and not what the base model says).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.training.spec import AdapterSpec
from preft_serve.training.trainer import TrainConfig, TrainResult, train
from tests.engine import oracle, reft_oracle
from tests.support.engine import Engine

FACTS = [
    ("What is my pet's name?", "Biscuit"),
    ("Where do I live?", "Lisbon"),
    ("My sign-off?", "Warmly"),
]
# kind -> (spec, steps, learning rate, loss it must get below). Prompt-only ReFT on a
# two-layer model reaches decode tokens only through layer 1's keys and values, so it
# needs more steps than LoRA to memorise.
KINDS: dict[str, tuple[AdapterSpec, int, float, float]] = {
    "lora-prefill": (AdapterSpec(AdapterType.LORA, AdapterMode.PREFILL, rank=8), 60, 1e-2, 0.1),
    "lora-all": (AdapterSpec(AdapterType.LORA, AdapterMode.ALL, rank=8), 60, 1e-2, 0.1),
    "direft": (AdapterSpec(AdapterType.DIREFT, rank=8, positions="prefill"), 200, 3e-2, 1.0),
    "loreft": (AdapterSpec(AdapterType.LOREFT, rank=8, positions="f4+l4"), 200, 3e-2, 1.0),
}


@pytest.fixture(scope="module")
def llama(engines: dict[str, Engine]) -> Engine:
    return engines["tiny-llama"]


@pytest.fixture(scope="module")
def tokenizer(llama: Engine) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(llama.model_dir))


@pytest.fixture(scope="module")
def trained(llama: Engine, tmp_path_factory: pytest.TempPathFactory) -> dict[str, TrainResult]:
    root = tmp_path_factory.mktemp("trained")
    data = root / "facts.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            )
            + "\n"
            for q, a in FACTS
        )
    )
    return {
        kind: train(
            TrainConfig(
                data=data,
                model=llama.model_dir,
                out=root / kind,
                adapter=spec,
                max_steps=steps,
                batch_size=len(FACTS),
                learning_rate=lr,
                progress=False,
            ),
            say=lambda _: None,
        )
        for kind, (spec, steps, lr, _) in KINDS.items()
    }


def prompt_ids(tokenizer: Any, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_trained_adapter_served_by_the_engine_gives_the_trained_answers(
    kind: str, llama: Engine, tokenizer: Any, trained: dict[str, TrainResult]
) -> None:
    spec, _, _, max_loss = KINDS[kind]
    result = trained[kind]
    assert result.train_loss < max_loss
    curve = [point["loss"] for point in result.metrics["train_loss"]]
    assert curve[-1] < curve[0] / 4  # it learned, from ~ln(vocab)
    prompts = [prompt_ids(tokenizer, q) for q, _ in FACTS]
    answers = [a + "\n" for _, a in FACTS]  # the toy template ends a turn with a newline
    lengths = [len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers]
    lora = llama.lora(f"trained-{kind}", result.out)
    for ids, answer, n in zip(prompts, answers, lengths):
        served = llama.tokens([ids], [lora], n)[0]
        assert tokenizer.decode(served) == answer
        if spec.type is AdapterType.LORA:
            generate = (
                oracle.generate_prefill if spec.mode is AdapterMode.PREFILL else oracle.generate_all
            )
            assert served == generate(llama.model_dir, result.out, ids, n)
        else:
            assert served == reft_oracle.generate_reft(llama.model_dir, result.out, ids, n)
        assert tokenizer.decode(llama.tokens([ids], [None], n)[0]) != answer  # base can't
