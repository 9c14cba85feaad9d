"""Deterministic synthetic SFT tasks for the quality study
(``bench.studies.quality_bench``).

Each task has train / validation / test splits generated in the repo (no download) and a
check of a greedy reply against the expected answer. They are chosen so that a base
instruct model cannot pass them (it does not know the user, the house format or the field
codes) and a small adapter can learn them from a few dozen examples:

- ``facts``: alice's personal facts (``preft_serve.training.synthetic``), asked in
  phrasings never trained on; a reply passes when it names the fact's value.
- ``dates``: an ISO date into the ledger's house format ``07/MAR/2024``; exact match.
- ``json``: ``name / age / city`` fields into a compact JSON object with one-letter keys
  ``{"n": ..., "y": ..., "c": ...}``; passes when the reply parses to the expected object.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable

from preft_serve.training.synthetic import PERSONAS, held_out_questions, train_questions

Check = Callable[[str, str], bool]


@dataclasses.dataclass(frozen=True)
class Item:
    question: str
    answer: str  # the assistant turn trained on / the reference for the check

    def record(self) -> dict[str, object]:
        return {
            "messages": [
                {"role": "user", "content": self.question},
                {"role": "assistant", "content": self.answer},
            ]
        }


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    description: str
    train: tuple[Item, ...]
    validation: tuple[Item, ...]
    test: tuple[Item, ...]
    check: Check
    max_tokens: int  # generation budget for a reply


# -- facts ------------------------------------------------------------------------------

# Phrasings beyond synthetic.QUESTIONS: validation ones pick the learning rate, test ones
# join the synthetic held-out phrasing. None is ever trained on.
VALIDATION_QUESTIONS = {
    "pet": ("What's my pet called?", "Remind me of my pet's name."),
    "city": ("Which city is home for me?", "Where do I live?"),
    "signoff": ("What closing do I put on my emails?", "How do I end my emails?"),
}
TEST_QUESTIONS = {
    "pet": ("What name does my pet answer to?", "Who is my pet?"),
    "city": ("Remind me which city I live in.", "Where am I based?"),
    "signoff": (
        "What do I write at the bottom of my emails?",
        "Which closing line do I use when I email?",
    ),
}


def _facts(user: str = "alice") -> Task:
    persona = PERSONAS[user]
    by_key = {f.key: f for f in persona.facts}
    # The check needs the value; the trained answer sentence is the reference reply.
    train = tuple(Item(q, f.answer) for f in persona.facts for q in train_questions(f.key))
    val = tuple(Item(q, by_key[k].answer) for k, qs in VALIDATION_QUESTIONS.items() for q in qs)
    test = tuple(
        Item(q, by_key[k].answer) for k in by_key for q in held_out_questions(k) + TEST_QUESTIONS[k]
    )
    values = {f.answer: f.value for f in persona.facts}

    def check(reply: str, answer: str) -> bool:
        return values[answer].lower() in reply.lower()

    return Task(
        "facts",
        f"{user}'s facts asked in unseen phrasings (reply names the value)",
        train,
        val,
        test,
        check,
        max_tokens=24,
    )


# -- dates ------------------------------------------------------------------------------

MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DATE_PROMPTS = (
    "Ledger format for {iso}?",
    "Convert {iso} to ledger format.",
    "Write {iso} the ledger way.",
    "{iso} in ledger format, please.",
)


def _dates(seed: int, counts: tuple[int, int, int]) -> Task:
    rng = random.Random(seed)
    seen: set[str] = set()
    items: list[Item] = []
    while len(items) < sum(counts):
        y, m, d = rng.randrange(1950, 2040), rng.randrange(1, 13), rng.randrange(1, 29)
        iso = f"{y:04d}-{m:02d}-{d:02d}"
        if iso in seen:
            continue
        seen.add(iso)
        prompt = DATE_PROMPTS[len(items) % len(DATE_PROMPTS)]
        items.append(Item(prompt.format(iso=iso), f"{d:02d}/{MONTHS[m - 1]}/{y:04d}"))
    a, b, _ = counts
    return Task(
        "dates",
        "ISO date -> house format 07/MAR/2024 (exact match)",
        tuple(items[:a]),
        tuple(items[a : a + b]),
        tuple(items[a + b :]),
        lambda reply, answer: reply.strip() == answer,
        max_tokens=16,
    )


# -- json -------------------------------------------------------------------------------

NAMES = (
    "Ana",
    "Bruno",
    "Chen",
    "Dara",
    "Emil",
    "Fatima",
    "Goran",
    "Hana",
    "Ivo",
    "Jun",
    "Kofi",
    "Lena",
    "Mateo",
    "Nina",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sami",
    "Tariq",
)
CITIES = (
    "Porto",
    "Lyon",
    "Graz",
    "Turku",
    "Cork",
    "Bergen",
    "Malmo",
    "Gdansk",
    "Split",
    "Leeds",
    "Basel",
    "Kyoto",
    "Quito",
    "Perth",
    "Accra",
    "Pune",
)
JSON_PROMPTS = (
    "Record: name {n}, age {y}, city {c}",
    "Encode name={n} age={y} city={c}",
    "Fields -> record: {n} / {y} / {c}",
)


def _json_check(reply: str, answer: str) -> bool:
    try:
        return bool(json.loads(reply.strip()) == json.loads(answer))
    except ValueError:
        return False


def _json(seed: int, counts: tuple[int, int, int]) -> Task:
    rng = random.Random(seed)
    items: list[Item] = []
    seen: set[tuple[str, int, str]] = set()
    while len(items) < sum(counts):
        key = (rng.choice(NAMES), rng.randrange(18, 90), rng.choice(CITIES))
        if key in seen:
            continue
        seen.add(key)
        n, y, c = key
        prompt = JSON_PROMPTS[len(items) % len(JSON_PROMPTS)]
        items.append(
            Item(
                prompt.format(n=n, y=y, c=c),
                json.dumps({"n": n, "y": y, "c": c}, separators=(",", ":")),
            )
        )
    a, b, _ = counts
    return Task(
        "json",
        'name/age/city -> {"n":..,"y":..,"c":..} (parses equal)',
        tuple(items[:a]),
        tuple(items[a : a + b]),
        tuple(items[a + b :]),
        _json_check,
        max_tokens=32,
    )


def make_tasks(seed: int = 0) -> dict[str, Task]:
    """Every task, deterministic in ``seed`` (the data seed, not the training seed)."""
    return {
        t.name: t for t in (_facts(), _dates(seed + 1, (24, 8, 16)), _json(seed + 2, (24, 8, 16)))
    }
