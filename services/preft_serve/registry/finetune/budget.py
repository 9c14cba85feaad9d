"""What one fine-tuning job may cost, decided before it starts.

A tenant picks ``batch_size`` (up to 256) and ``max_seq_len`` (up to 32,768), and a trainer's
memory grows with their product: activations saved for the backward pass per token and
layer, and logits over the vocabulary per token. :func:`memory_estimate` adds these up from
the base model's ``config.json`` so that a job which cannot fit is refused with a 400 naming
the limit instead of growing a trainer until the host swaps. It is meant as an upper bound:
every example is taken to be as long as the file's longest conversation (its bytes, never
fewer than its tokens) or ``max_seq_len``, whichever is shorter, and the per-token cost is
above the peak resident memory measured for CPU trainers (docs/fine-tuning.md, "Limits").
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from preft_serve.common.errors import BadRequest

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
        return cls(hidden=hidden, intermediate=int(config.get("intermediate_size", 4 * hidden)),
                   layers=int(config["num_hidden_layers"]),
                   vocab=int(config["vocab_size"]))

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


def check_memory(shape: ModelShape, batch: int, max_seq_len: int,
                 longest_line_bytes: int | None, limit: int, setting: str) -> int:
    """The job's estimate; a 400 naming ``setting`` when it is over ``limit``."""
    seq = sequence_bound(max_seq_len, longest_line_bytes)
    need = memory_estimate(shape, batch, seq)
    if need > limit:
        raise BadRequest(
            f"this job would need about {_gib(need)} of memory (batch_size {batch} x "
            f"{seq} tokens per example on this base model), more than the {_gib(limit)} a "
            f"trainer may use ({setting}); lower hyperparameters.batch_size or "
            "method.preft.max_seq_len, or shorten the longest conversations",
            param="hyperparameters", code="job_too_large")
    return need
