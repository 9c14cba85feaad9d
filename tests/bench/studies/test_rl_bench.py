"""The RL study's pieces on a toy model: its sampler serves each adapter mode the way the
worker does, consistently with the loss it trains (what the policy samples is what the
gated forward of the trainer predicts), the reward and GRPO's advantages, and one policy
step moves the reward's log-probabilities the right way."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from bench.studies.rl_bench import Question, advantages, policy_loss, sample
from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.toymodels import make_model
from preft_serve.training.adapters import attach_adapter
from preft_serve.training.batch import collate
from preft_serve.training.data import Example
from preft_serve.training.spec import AdapterSpec

PROMPTS = [[5, 9, 14, 3, 7, 21], [8, 2, 30], [11, 4, 6, 19]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny-llama", tmp_path_factory.mktemp("rl") / "model")


def _policy(model_dir: Path, mode: AdapterMode) -> tuple[torch.nn.Module, object]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    for p in model.parameters():
        p.requires_grad_(False)
    adapter = attach_adapter(model, AdapterSpec(type=AdapterType.LORA, mode=mode, rank=4))
    with torch.no_grad():  # a LoRA that changes the answers (peft starts B at zero)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model.eval(), adapter


def _teacher_forced_argmax(
    model: torch.nn.Module, adapter: object, prompt: list[int], answer: list[int]
) -> list[int]:
    batch = collate([Example(tuple(prompt), tuple(answer), line=1, turn=0)], pad_id=0)
    adapter.set_batch(batch)  # type: ignore[attr-defined]
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()


@pytest.mark.parametrize("mode", [AdapterMode.PREFILL, AdapterMode.ALL])
def test_sampling_is_what_the_trained_forward_predicts(model_dir: Path, mode: AdapterMode) -> None:
    model, adapter = _policy(model_dir, mode)
    answers = sample(model, adapter, PROMPTS, max_new=6, pad=0, eos=-1, generator=None)
    for prompt, answer in zip(PROMPTS, answers, strict=True):
        assert len(answer) == 6
        assert _teacher_forced_argmax(model, adapter, prompt, answer) == answer


def test_prefill_only_decodes_with_the_base_weights(model_dir: Path) -> None:
    """PreFT answers differ from all-token ones (the adapter stops after the prompt) and
    from the base model's (the prompt was adapted)."""
    preft = sample(*_policy(model_dir, AdapterMode.PREFILL), PROMPTS, 6, 0, -1, None)
    every = sample(*_policy(model_dir, AdapterMode.ALL), PROMPTS, 6, 0, -1, None)
    base_model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        base = [
            base_model.generate(
                torch.tensor([p]),
                max_new_tokens=6,
                do_sample=False,
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                pad_token_id=0,
            )[0, len(p) :].tolist()
            for p in PROMPTS
        ]
    assert preft != every and preft != base


def test_reward_and_advantages() -> None:
    q = Question(47, 8)
    assert q.reward("47 + 8 = 55") == 1.0 and q.reward("55") == 1.0
    assert q.reward("47 + 8 = 54") == 0.0 and q.reward("To solve this, we add 47") == 0.0
    adv = advantages([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0], group=4)
    assert adv[4:] == [0.0] * 4  # a group that all scored alike teaches nothing
    assert adv[0] > 0 > adv[1] and abs(sum(adv[:4])) < 1e-6


def test_a_policy_step_raises_the_rewarded_answer(model_dir: Path) -> None:
    model, adapter = _policy(model_dir, AdapterMode.PREFILL)
    prompts = [PROMPTS[0]] * 2
    answers = [[3, 4, 5], [6, 7, 8]]
    adv = advantages([1.0, 0.0], group=2)
    params = adapter.parameters()  # type: ignore[attr-defined]
    optimizer = torch.optim.SGD(params, lr=0.05)

    def logp_gap() -> float:
        with torch.no_grad():
            # the loss with advantages (1, 0) is -mean log p of the first answer
            good = -policy_loss(model, adapter, prompts[:1], answers[:1], [1.0], 0).item()
            bad = -policy_loss(model, adapter, prompts[1:], answers[1:], [1.0], 0).item()
        return good - bad

    before = logp_gap()
    loss = policy_loss(model, adapter, prompts, answers, adv, pad=0)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    assert logp_gap() > before
