"""The training loop: AdamW, warmup then cosine/linear decay, gradient accumulation and
clipping, periodic evaluation, resumable checkpoints, and a metrics JSON beside the adapter.

Data order is a pure function of (seed, epoch), so a resumed run sees exactly the batches
the interrupted one would have seen.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from preft_serve.adapters.format import AdapterType
from preft_serve.training.adapters import TrainableAdapter, attach_adapter
from preft_serve.training.batch import Batch, collate
from preft_serve.training.config import Schedule, TrainConfig
from preft_serve.training.data import Dataset, Example, load_dataset
from preft_serve.training.loss import mean_nll, summed_nll

__all__ = ["METRICS_FILE", "Schedule", "TrainConfig", "TrainResult", "train"]
METRICS_FILE = "training_metrics.json"
CHECKPOINTS = "checkpoints"
Say = Callable[[str], None]


@dataclasses.dataclass
class TrainResult:
    out: Path
    steps: int
    train_loss: float
    eval_loss: float | None
    metrics: dict[str, Any]


def load_base(config: TrainConfig) -> tuple[Any, Any]:
    """(tokenizer, frozen causal LM) from the model directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[config.dtype]
    tokenizer = AutoTokenizer.from_pretrained(str(config.model))
    model = AutoModelForCausalLM.from_pretrained(str(config.model), dtype=dtype)
    model.to(config.resolved_device())
    for p in model.parameters():
        p.requires_grad_(False)
    return tokenizer, model.eval()


def pad_id(tokenizer: Any) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0  # pragma: no cover


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def step_examples(data: list[Example], step: int, batch_size: int, seed: int) -> list[Example]:
    """The examples of optimizer step ``step`` (0-based): epochs of shuffled batches."""
    per_epoch = math.ceil(len(data) / batch_size)
    epoch, index = divmod(step, per_epoch)
    order = epoch_order(len(data), seed, epoch)
    return [data[i] for i in order[index * batch_size : (index + 1) * batch_size]]


def _scheduler(config: TrainConfig, optimizer: torch.optim.Optimizer, total: int) -> Any:
    from transformers import (
        get_constant_schedule_with_warmup,
        get_cosine_schedule_with_warmup,
        get_linear_schedule_with_warmup,
    )

    warmup = config.warmup_steps if config.warmup_steps is not None else int(0.05 * total)
    if config.schedule is Schedule.CONSTANT:
        return get_constant_schedule_with_warmup(optimizer, warmup)
    make = (
        get_cosine_schedule_with_warmup
        if config.schedule is Schedule.COSINE
        else get_linear_schedule_with_warmup
    )
    return make(optimizer, warmup, total)


class _Progress:
    """A tqdm bar on a terminal, a plain line every few steps otherwise (logs, CI)."""

    def __init__(self, total: int, start: int, enabled: bool, say: Say) -> None:
        from tqdm import tqdm

        self.say, self.total = say, total
        tty = enabled and sys.stderr.isatty()
        self.bar = tqdm(
            total=total,
            initial=start,
            unit="step",
            disable=not tty,
            dynamic_ncols=True,
            file=sys.stderr,
        )
        self.lines = enabled and not tty
        self.every = max(1, total // 10)

    def update(self, step: int, loss: float, lr: float, tok_s: float) -> None:
        self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:.0f}")
        self.bar.update(1)
        if self.lines and (step % self.every == 0 or step == self.total):
            self.say(f"step {step}/{self.total}  loss {loss:.4f}  lr {lr:.2e}  {tok_s:.0f} tok/s")

    def close(self) -> None:
        self.bar.close()


def _save_checkpoint(
    path: Path,
    adapter: TrainableAdapter,
    optimizer: Any,
    scheduler: Any,
    step: int,
    history: dict[str, Any],
) -> None:
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(
        {
            "adapter": adapter.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "step": step,
            "history": history,
            "torch_rng": torch.get_rng_state(),
        },
        tmp / "state.pt",
    )
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def _latest_checkpoint(out: Path) -> Path | None:
    found = sorted(
        (p for p in (out / CHECKPOINTS).glob("step-*") if (p / "state.pt").is_file()),
        key=lambda p: int(p.name.split("-")[1]),
    )
    return found[-1] if found else None


def _batches(examples: list[Example], size: int, pad: int, device: torch.device) -> list[Batch]:
    return [collate(examples[i : i + size], pad, device) for i in range(0, len(examples), size)]


def train(config: TrainConfig, say: Say = print) -> TrainResult:
    """Train one adapter; returns where it was saved and the final losses."""
    started = time.monotonic()
    torch.manual_seed(config.seed)
    device = config.resolved_device()
    say(f"loading {config.model} ({config.dtype}, {device})")
    tokenizer, model = load_base(config)
    train_set = load_dataset(config.data, tokenizer, config.max_seq_len, config.overlong)
    say(f"training data: {train_set.summary()}")
    eval_set: Dataset | None = None
    if config.validation is not None:
        eval_set = load_dataset(config.validation, tokenizer, config.max_seq_len, config.overlong)
        say(f"validation data: {eval_set.summary()}")
    adapter = attach_adapter(model, config.adapter, config.seed)
    params = adapter.parameters()
    say(
        f"adapter: {config.adapter.describe()}, "
        f"{sum(p.numel() for p in params):,} trainable parameters"
    )

    per_epoch = math.ceil(len(train_set.examples) / config.batch_size)
    total = config.max_steps or per_epoch * config.epochs
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    scheduler = _scheduler(config, optimizer, total)
    pad = pad_id(tokenizer)
    micro = config.micro_batch_size or config.batch_size
    eval_batches = _batches(eval_set.examples, micro, pad, device) if eval_set else []
    history: dict[str, Any] = {"train": [], "eval": [], "tokens": 0, "response_tokens": 0}
    start_step = 0
    if config.resume and (checkpoint := _latest_checkpoint(config.out)) is not None:
        state = torch.load(checkpoint / "state.pt", weights_only=True)
        adapter.load_state_dict(state["adapter"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        start_step, history = int(state["step"]), state["history"]
        say(f"resumed from {checkpoint} (step {start_step}/{total})")

    config.out.mkdir(parents=True, exist_ok=True)
    progress = _Progress(total, start_step, config.progress, say)
    loss_value = float("nan")
    try:
        for step in range(start_step, total):
            tick = time.monotonic()
            examples = step_examples(train_set.examples, step, config.batch_size, config.seed)
            batches = _batches(examples, micro, pad, device)
            count = sum(b.response_tokens for b in batches)
            optimizer.zero_grad(set_to_none=True)
            total_nll = 0.0
            for batch in batches:
                nll = summed_nll(adapter, batch)
                (nll / count).backward()
                total_nll += float(nll.detach())
            torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            loss_value = total_nll / count
            tokens = sum(b.tokens for b in batches)
            history["tokens"] += tokens
            history["response_tokens"] += count
            lr = float(scheduler.get_last_lr()[0])
            history["train"].append({"step": step + 1, "loss": loss_value, "lr": lr})
            progress.update(step + 1, loss_value, lr, tokens / (time.monotonic() - tick))
            done = step + 1
            if (
                eval_batches
                and config.eval_every
                and done % config.eval_every == 0
                and done < total
            ):
                history["eval"].append({"step": done, "loss": mean_nll(adapter, eval_batches)})
            if config.save_every and done % config.save_every == 0 and done < total:
                _save_checkpoint(
                    config.out / CHECKPOINTS / f"step-{done}",
                    adapter,
                    optimizer,
                    scheduler,
                    done,
                    history,
                )
    finally:
        progress.close()

    eval_loss = None
    if eval_batches:
        eval_loss = mean_nll(adapter, eval_batches)
        history["eval"].append({"step": total, "loss": eval_loss})
    adapter.save(config.out, str(config.model))
    shutil.rmtree(config.out / CHECKPOINTS, ignore_errors=True)
    wall = time.monotonic() - started
    metrics = {
        "config": config.as_json(),
        "adapter_type": config.adapter.type.value,
        "mode": config.adapter.mode.value if config.adapter.type is AdapterType.LORA else "prefill",
        "steps": total,
        "examples": len(train_set.examples),
        "conversations": train_set.conversations,
        "truncated": train_set.truncated,
        "dropped": train_set.dropped,
        "tokens_seen": history["tokens"],
        "response_tokens_seen": history["response_tokens"],
        "train_loss": history["train"],
        "eval_loss": history["eval"],
        "final_train_loss": loss_value,
        "final_eval_loss": eval_loss,
        "wall_seconds": round(wall, 2),
    }
    (config.out / METRICS_FILE).write_text(json.dumps(metrics, indent=1))
    say(
        f"saved {config.out} (final train loss {loss_value:.4f}"
        + (f", eval loss {eval_loss:.4f}" if eval_loss is not None else "")
        + f", {wall:.0f} s)"
    )
    return TrainResult(config.out, total, loss_value, eval_loss, metrics)
