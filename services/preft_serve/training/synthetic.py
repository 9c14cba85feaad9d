"""Deterministic synthetic personalisation data: facts about a user that no base model can
know (a pet's name, a home city, a preferred sign-off), asked in varied phrasings.

Each fact has training phrasings and held-out phrasings, so a trained adapter can be judged
on questions it never saw. Used by the ``make run`` demo, the tests and the docs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Fact:
    """One personal fact: the answer sentence holds ``value``, which a reply must contain."""

    key: str
    value: str
    answer: str


@dataclasses.dataclass(frozen=True)
class Persona:
    user: str
    facts: tuple[Fact, ...]


# Question phrasings per fact key: the first ones train, the last one is held out.
QUESTIONS: dict[str, tuple[str, ...]] = {
    "pet": (
        "What is my pet's name?",
        "Do you remember what my pet is called?",
        "Tell me the name of my pet.",
        "What did I name my pet?",
    ),
    "city": (
        "Which city do I live in?",
        "Where is my home?",
        "In what city is my home?",
        "What city do I call home?",
    ),
    "signoff": (
        "How do I sign off my emails?",
        "What sign-off do I use in emails?",
        "Which sign-off do I prefer at the end of an email?",
        "How should you end an email written for me?",
    ),
}
HELD_OUT = 1  # the last phrasing of each fact is never trained on

PERSONAS: dict[str, Persona] = {
    p.user: p
    for p in (
        Persona(
            "alice",
            (
                Fact("pet", "Biscuit", "Your pet is a beagle named Biscuit."),
                Fact("city", "Lisbon", "You live in Lisbon."),
                Fact("signoff", "Warmly, Alice", 'You sign off with "Warmly, Alice".'),
            ),
        ),
        Persona(
            "bob",
            (
                Fact("pet", "Pixel", "Your pet is a grey cat named Pixel."),
                Fact("city", "Oslo", "You live in Oslo."),
                Fact("signoff", "Cheers, Bob", 'You sign off with "Cheers, Bob".'),
            ),
        ),
        Persona(
            "carol",
            (
                Fact("pet", "Mango", "Your pet is a parrot named Mango."),
                Fact("city", "Nairobi", "You live in Nairobi."),
                Fact("signoff", "Best, Carol", 'You sign off with "Best, Carol".'),
            ),
        ),
    )
}


def _chat(question: str, answer: str) -> dict[str, object]:
    return {
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]
    }


def train_questions(key: str) -> tuple[str, ...]:
    return QUESTIONS[key][:-HELD_OUT]


def held_out_questions(key: str) -> tuple[str, ...]:
    return QUESTIONS[key][-HELD_OUT:]


def training_records(persona: Persona) -> list[dict[str, object]]:
    """Every (fact, training phrasing) pair as one chat example."""
    return [_chat(q, fact.answer) for fact in persona.facts for q in train_questions(fact.key)]


def held_out_pairs(persona: Persona) -> list[tuple[str, Fact]]:
    """(question never trained on, the fact its answer must contain)."""
    return [(q, fact) for fact in persona.facts for q in held_out_questions(fact.key)]


def write_jsonl(records: Iterable[dict[str, object]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
