"""Padded batches of examples, and the per-token facts the adapters' gates read."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from preft_serve.training.data import Example

IGNORE = -100  # label of a position the loss skips


@dataclasses.dataclass
class Batch:
    """Right-padded examples. Labels are unshifted: ``labels[b, t] = ids[b, t]`` on
    response tokens and IGNORE elsewhere; the logit at position ``t - 1`` is scored
    against ``labels[b, t]``."""

    input_ids: torch.Tensor  # (B, S)
    attention_mask: torch.Tensor  # (B, S)
    labels: torch.Tensor  # (B, S)
    prompt_lens: torch.Tensor  # (B,) tokens before the response
    lengths: torch.Tensor  # (B,) real (unpadded) tokens

    @property
    def response_tokens(self) -> int:
        return int((self.labels != IGNORE).sum())

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())

    def prompt_mask(self) -> torch.Tensor:
        """(B, S) true on prompt tokens, the ones a prefill-only adapter sees."""
        positions = torch.arange(self.input_ids.shape[1], device=self.input_ids.device)
        return positions[None, :] < self.prompt_lens[:, None]


def collate(examples: Sequence[Example], pad_id: int, device: torch.device | str = "cpu") -> Batch:
    width = max(len(e) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full_like(ids, IGNORE)
    mask = torch.zeros_like(ids)
    for row, example in enumerate(examples):
        tokens = torch.tensor(example.ids)
        ids[row, : len(tokens)] = tokens
        mask[row, : len(tokens)] = 1
        labels[row, len(example.prompt) : len(tokens)] = tokens[len(example.prompt) :]
    return Batch(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        labels=labels.to(device),
        prompt_lens=torch.tensor([len(e.prompt) for e in examples], device=device),
        lengths=torch.tensor([len(e) for e in examples], device=device),
    )
