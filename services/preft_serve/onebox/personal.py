"""The real-model demo of ``make run``: PreFT adapters trained on SmolLM2 for two users.

Each user gets a prefill-only LoRA trained with ``preft train``'s trainer on their
synthetic personal facts (:mod:`preft_serve.training.synthetic`). Training runs on the
first start only: an adapter is reused while its data and training recipe are unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from preft_serve.adapters.format import AdapterMode
from preft_serve.training.synthetic import PERSONAS, Fact, held_out_pairs, training_records

if TYPE_CHECKING:
    from preft_serve.training.trainer import TrainConfig

Say = Callable[[str], None]
DEMO_USERS = ("alice", "bob")
# Measured on SmolLM2 (2 cores): loss 3.4 -> 0.006 in 16 steps (~70 s), 3/3 held-out
# phrasings answered with the right fact.
STEPS = 16
LEARNING_RATE = 5e-3
RANK = 8
QUESTION_KEY = "pet"  # the fact the demo asks about, in a phrasing never trained on


@dataclasses.dataclass(frozen=True)
class TrainedUser:
    user: str
    adapter: str  # registry name
    directory: Path
    fact: Fact  # what the demo question must bring back


def demo_question() -> str:
    persona = PERSONAS[DEMO_USERS[0]]
    return next(q for q, fact in held_out_pairs(persona) if fact.key == QUESTION_KEY)


def _config(data: Path, model: Path, out: Path) -> TrainConfig:
    from preft_serve.training.spec import AdapterSpec
    from preft_serve.training.trainer import TrainConfig

    spec = AdapterSpec(mode=AdapterMode.PREFILL, rank=RANK)
    return TrainConfig(data=data, model=model, out=out, adapter=spec, max_steps=STEPS,
                       batch_size=len(training_records(PERSONAS[DEMO_USERS[0]])),
                       learning_rate=LEARNING_RATE, warmup_steps=1, progress=False)


def _is_current(out: Path, config: TrainConfig, data_text: str, data: Path) -> bool:
    from preft_serve.training.trainer import METRICS_FILE

    try:
        metrics = json.loads((out / METRICS_FILE).read_text())
        return bool(metrics["config"] == config.as_json() and data.read_text() == data_text)
    except (OSError, ValueError, KeyError):
        return False


def train_demo_users(root: Path, model: Path, say: Say) -> list[TrainedUser]:
    """Train (or reuse) one PreFT adapter per demo user under ``root``."""
    from preft_serve.training.trainer import train

    trained = []
    for user in DEMO_USERS:
        persona = PERSONAS[user]
        data = root / "data" / f"{user}.jsonl"
        text = "".join(json.dumps(r) + "\n" for r in training_records(persona))
        out = root / "adapters" / f"{user}-preft"
        config = _config(data, model, out)
        if _is_current(out, config, text, data):
            say(f"  {user}: PreFT adapter already trained ({out})")
        else:
            data.parent.mkdir(parents=True, exist_ok=True)
            data.write_text(text)
            say(f"  {user}: training a PreFT LoRA on {len(training_records(persona))} "
                f"examples of their facts ({STEPS} steps, about a minute)")
            start = time.monotonic()
            result = train(config, say=lambda _: None)
            say(f"  {user}: loss {result.metrics['train_loss'][0]['loss']:.2f} -> "
                f"{result.train_loss:.3f} in {time.monotonic() - start:.0f} s")
        fact = next(f for f in persona.facts if f.key == QUESTION_KEY)
        trained.append(TrainedUser(user, f"{user}-preft", out, fact))
    return trained


def judge(answer: str, user: TrainedUser | None, everyone: list[TrainedUser]) -> str:
    """'right fact' when the answer holds this user's fact and nobody else's."""
    found = [u.user for u in everyone if u.fact.value.lower() in answer.lower()]
    if user is None:
        return "knows none of them (as it should)" if not found else f"mentions {found}!"
    if found == [user.user]:
        return f"right fact ({user.fact.value})"
    return f"WRONG: expected {user.fact.value!r}, found facts of {found or 'nobody'}"
