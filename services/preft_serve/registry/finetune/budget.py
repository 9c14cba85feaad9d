"""What one fine-tuning job may cost, decided before it starts.

A tenant picks ``batch_size`` (up to 256) and ``max_seq_len`` (up to 32,768), and a trainer's
memory grows with their product: activations saved for the backward pass per token and
layer, and logits over the vocabulary per token. :func:`memory_estimate` adds these up from
the base model's ``config.json`` so that a job which cannot fit is refused with a 400 naming
the limit instead of growing a trainer until the host swaps. It is meant as an upper bound:
every example is taken to be as long as the file's longest conversation (its bytes, never
fewer than its tokens) or ``max_seq_len``, whichever is shorter, and the per-token cost is
above the peak resident memory measured for CPU trainers (docs/fine-tuning.md, "Limits").

A job must also keep at least one example: the trainer keeps an example whose prompt is
shorter than ``max_seq_len`` (its response cut to fit), so a file whose every prompt alone
fills ``max_seq_len`` trains nothing. The registry has no tokenizer, but no token stands for
more bytes than the vocabulary's longest entry (:func:`longest_token_bytes`), so a prompt's
text bytes over that length bound its tokens from below and :func:`check_fits` refuses such
a file at create. The bound is safe, never exact: a file it cannot prove hopeless still fails
in the trainer, with the same advice.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from preft_serve.common.domain_errors import InvalidRequest

# Python, torch and the tokenizer before the first batch (measured ~0.5 GiB on CPU).
RUNTIME_BYTES = 768 << 20
# Tokens a chat template may add beyond a line's JSON (a default system prompt).
TEMPLATE_TOKENS = 64
_F32 = 4


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The sizes of a base model that set a trainer's memory."""

    hidden: int
    intermediate: int
    layers: int
    vocab: int

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        hidden = int(config["hidden_size"])
        return cls(
            hidden=hidden,
            intermediate=int(config.get("intermediate_size", 4 * hidden)),
            layers=int(config["num_hidden_layers"]),
            vocab=int(config["vocab_size"]),
        )

    @classmethod
    def read(cls, config_path: Path) -> ModelShape:
        return cls.from_config(json.loads(config_path.read_text()))

    @property
    def parameters(self) -> int:
        per_layer = 4 * self.hidden * self.hidden + 3 * self.hidden * self.intermediate
        return 2 * self.vocab * self.hidden + self.layers * per_layer


def memory_estimate(shape: ModelShape, batch: int, seq: int) -> int:
    """Bytes a float32 trainer needs for one step of ``batch`` examples of ``seq`` tokens."""
    per_token_layer = (20 * shape.hidden + 4 * shape.intermediate) * _F32
    per_token = shape.layers * per_token_layer + 3 * shape.vocab * _F32  # logits, grads
    return RUNTIME_BYTES + shape.parameters * _F32 + batch * seq * per_token


def sequence_bound(max_seq_len: int, longest_line_bytes: int | None) -> int:
    """The longest example a file can make: no more tokens than its longest line's bytes
    (plus a chat template's own), and never more than ``max_seq_len``."""
    if longest_line_bytes is None:
        return max_seq_len
    return min(max_seq_len, longest_line_bytes + TEMPLATE_TOKENS)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def check_memory(
    shape: ModelShape, batch: int, max_seq_len: int, longest_line_bytes: int | None, limit: int
) -> int:
    """The job's estimate; a 400 stating ``limit`` when the estimate is over it."""
    seq = sequence_bound(max_seq_len, longest_line_bytes)
    need = memory_estimate(shape, batch, seq)
    if need > limit:
        raise InvalidRequest(
            f"this job would need about {_gib(need)} of memory (batch_size {batch} x "
            f"{seq} tokens per example on this base model), more than the {_gib(limit)} a "
            "trainer may use on this deployment; lower hyperparameters.batch_size or "
            "method.preft.max_seq_len, or shorten the longest conversations",
            param="hyperparameters",
            code="job_too_large",
        )
    return need


def _byte_level(section: Any) -> bool:
    """Whether a tokenizer.json decoder (or a Sequence of them) is GPT-2's ByteLevel, whose
    vocabulary spells every byte as one character."""
    if not isinstance(section, dict):
        return False
    if section.get("type") == "ByteLevel":
        return True
    return any(_byte_level(d) for d in section.get("decoders") or ())


def longest_token_bytes(model_dir: Path) -> int | None:
    """The most bytes of text one token of the base model's ``tokenizer.json`` stands for;
    None without a readable one. Byte-level vocabularies count one byte per character;
    others count each entry's UTF-8 bytes, which over-counts markers such as
    SentencePiece's ``▁`` or ``<0x41>`` (the safe side). Added tokens count too: a
    template's own, and any a conversation spells out."""
    try:
        raw = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
        vocab = raw["model"]["vocab"]
        pieces = list(vocab) if isinstance(vocab, dict) else [entry[0] for entry in vocab]
        size = len if _byte_level(raw.get("decoder")) else (lambda t: len(t.encode("utf-8")))
        added = [len(t["content"].encode("utf-8")) for t in raw.get("added_tokens") or ()]
        return max([*map(size, pieces), *added, 1])
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def min_tokens(text_bytes: int, longest_token: int) -> int:
    """The fewest tokens ``text_bytes`` bytes of text can be."""
    return math.ceil(text_bytes / longest_token)


def check_fits(
    file_id: str,
    param: str,
    max_seq_len: int,
    limit: int,
    shortest_prompt_bytes: int | None,
    longest_token: int | None,
) -> None:
    """A 400 when every example of the file is certain to be dropped: even its shortest
    prompt has ``max_seq_len`` tokens or more. The advice names the value that would keep
    one, or says it is over ``limit`` (the largest ``max_seq_len`` a job may ask)."""
    if shortest_prompt_bytes is None or longest_token is None:
        return
    shortest = min_tokens(shortest_prompt_bytes, longest_token)
    if shortest < max_seq_len:
        return
    raise InvalidRequest(
        nothing_fits(f"file {file_id}", max_seq_len, shortest + 1, limit, certain=False),
        param=param,
        code="examples_too_long",
    )


def nothing_fits(what: str, max_seq_len: int, needed: int, limit: int, certain: bool = True) -> str:
    """Why a file trains nothing and what to change: ``needed`` is the smallest
    ``max_seq_len`` that keeps an example (a lower bound unless ``certain``), offered only
    when a job may ask for it (``limit``)."""
    at_least = "" if certain else "at least "
    fix = (
        f"shorten the conversations, or raise method.preft.max_seq_len to {needed} or "
        f"more (at most {limit})"
        if needed <= limit
        else f"shorten the conversations: even the largest method.preft.max_seq_len, {limit}, "
        "cannot hold one"
    )
    return (
        f"every example in {what} is longer than method.preft.max_seq_len {max_seq_len} "
        f"tokens: keeping the shortest needs {at_least}{needed} (its prompt, the messages "
        f"before the assistant reply, is never cut); {fix}"
    )
