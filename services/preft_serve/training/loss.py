"""The training loss: next-token cross-entropy on response tokens, adapter gated as served.

Logits are computed only where a label is scored (the response positions), so the
vocabulary projection costs response tokens, not every prompt token.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from preft_serve.training.adapters import TrainableAdapter
from preft_serve.training.batch import IGNORE, Batch


def summed_nll(adapter: TrainableAdapter, batch: Batch) -> torch.Tensor:
    """Sum over the batch's response tokens of ``-log p(token | everything before it)``."""
    adapter.set_batch(batch)
    try:
        model = adapter.causal_lm
        hidden = model.get_decoder()(  # type: ignore[operator]
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            use_cache=False,
        ).last_hidden_state
    finally:
        adapter.set_batch(None)
    targets = batch.labels[:, 1:]
    scored = targets != IGNORE
    logits = model.get_output_embeddings()(hidden[:, :-1][scored])  # type: ignore[operator]
    return F.cross_entropy(logits.float(), targets[scored], reduction="sum")


@torch.no_grad()
def mean_nll(adapter: TrainableAdapter, batches: list[Batch]) -> float:
    """Token-averaged loss over ``batches`` (evaluation)."""
    total, count = 0.0, 0
    for batch in batches:
        total += float(summed_nll(adapter, batch))
        count += batch.response_tokens
    return total / max(count, 1)
