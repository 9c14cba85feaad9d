"""The real-model demo of ``make run``: PreFT adapters trained on SmolLM2 for two users.

Each user gets a prefill-only LoRA trained with ``preft train``'s trainer on their
synthetic personal facts (:mod:`preft_serve.training.synthetic`). Training runs on the
first start only: an adapter is reused while its data, training recipe and base model are
unchanged. The cache key is made of their content, not their paths, so a moved or copied
``var/`` keeps its adapters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from preft_serve.adapters.format import CONFIG_FILE, WEIGHTS_FILE, AdapterMode
from preft_serve.basemodels.prepare import MARKER
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
CACHE_KEY_FILE = "demo_cache_key"  # beside the adapter's files; uploads take only those two
# Where a run reads and writes, not what it learns: left out of the cache key.
_PLACES = ("data", "model", "out", "progress")


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
    return TrainConfig(
        data=data,
        model=model,
        out=out,
        adapter=spec,
        max_steps=STEPS,
        batch_size=len(training_records(PERSONAS[DEMO_USERS[0]])),
        learning_rate=LEARNING_RATE,
        warmup_steps=1,
        progress=False,
    )


def model_identity(model: Path) -> str:
    """What the base model is, wherever it lies: the marker of ``preft model prepare`` (it
    pins the wheel's sha256) with config.json, else a digest of every file in the folder."""
    digest = hashlib.sha256()
    names = (
        [MARKER, "config.json"]
        if (model / MARKER).is_file()
        else sorted(p.name for p in model.iterdir() if p.is_file())
    )
    for name in names:
        digest.update(name.encode() + b"\0")
        with open(model / name, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


def cache_key(config: TrainConfig, data_text: str, model_id: str) -> str:
    """The content an adapter was trained from: data, recipe and base model."""
    recipe = {k: v for k, v in config.as_json().items() if k not in _PLACES}
    return hashlib.sha256(
        json.dumps(
            {"data": data_text, "recipe": recipe, "model": model_id}, sort_keys=True
        ).encode()
    ).hexdigest()


def _is_current(out: Path, key: str) -> bool:
    try:
        stored = (out / CACHE_KEY_FILE).read_text().strip()
    except OSError:
        return False
    return stored == key and all((out / n).is_file() for n in (CONFIG_FILE, WEIGHTS_FILE))


def train_demo_users(root: Path, model: Path, say: Say) -> list[TrainedUser]:
    """Train (or reuse) one PreFT adapter per demo user under ``root``."""
    from preft_serve.training.trainer import train

    trained = []
    model_id = model_identity(model)
    for user in DEMO_USERS:
        persona = PERSONAS[user]
        data = root / "data" / f"{user}.jsonl"
        text = "".join(json.dumps(r) + "\n" for r in training_records(persona))
        out = root / "adapters" / f"{user}-preft"
        config = _config(data, model, out)
        key = cache_key(config, text, model_id)
        if not data.is_file() or data.read_text() != text:
            data.parent.mkdir(parents=True, exist_ok=True)
            data.write_text(text)
        if _is_current(out, key):
            say(f"  {user}: PreFT adapter already trained ({out})")
        else:
            (out / CACHE_KEY_FILE).unlink(missing_ok=True)
            say(
                f"  {user}: training a PreFT LoRA on {len(training_records(persona))} "
                f"examples of their facts ({STEPS} steps, about a minute)"
            )
            start = time.monotonic()
            result = train(config, say=lambda _: None)
            say(
                f"  {user}: loss {result.metrics['train_loss'][0]['loss']:.2f} -> "
                f"{result.train_loss:.3f} in {time.monotonic() - start:.0f} s"
            )
            (out / CACHE_KEY_FILE).write_text(key + "\n")
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
