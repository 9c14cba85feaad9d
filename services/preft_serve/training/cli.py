"""``preft train``: fine-tune an adapter on chat JSONL, ready for ``preft adapter upload``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.training.config import Schedule, TrainConfig
from preft_serve.training.data import DataError, Overlong
from preft_serve.training.spec import LORA_MODULES, AdapterSpec

EPILOG = """examples:
  preft train train.jsonl --model var/models/smollm2-135m-instruct --out adapters/alice
  preft train train.jsonl --validation val.jsonl --model MODEL --out OUT --mode all --rank 16
  preft train train.jsonl --model MODEL --out OUT --type direft --rank 4 --positions f5+l5
  preft adapter upload OUT --name alice --mode prefill     # then serve it

Data: one {"messages": [...]} per line (OpenAI's chat fine-tuning format); the loss covers
assistant turns only. --mode prefill (PreFT) puts the adapter on the prompt only, exactly
as the worker serves it; see docs/training.md."""


def _layers(text: str) -> tuple[int, ...] | None:
    if text == "all":
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--layers takes 'all' or comma-separated layer indices (got {text!r})"
        ) from None


def _modules(text: str) -> tuple[str, ...]:
    if text == "all-linear":
        return LORA_MODULES
    return tuple(m.strip() for m in text.split(",") if m.strip())


def add_parser(groups: Any) -> None:
    p = groups.add_parser(
        "train",
        help="fine-tune an adapter on chat JSONL (local; no registry needed)",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("data", type=Path, help="training JSONL")
    p.add_argument("--validation", type=Path, help="validation JSONL (evaluation loss)")
    p.add_argument(
        "--model",
        type=Path,
        required=True,
        help="base model directory (e.g. from 'preft model prepare')",
    )
    p.add_argument("--out", type=Path, required=True, help="adapter directory to write")
    a = p.add_argument_group("adapter")
    a.add_argument("--type", choices=[t.value for t in AdapterType], default="lora")
    a.add_argument(
        "--mode",
        choices=[m.value for m in AdapterMode],
        default="prefill",
        help="prefill: adapter on prompt tokens only (PreFT, default); all: "
        "classic, every token (LoRA only)",
    )
    a.add_argument("--rank", type=int, default=8, help="LoRA r / ReFT rank (default 8)")
    a.add_argument("--alpha", type=float, help="LoRA alpha (default: the rank)")
    a.add_argument(
        "--target-modules",
        type=_modules,
        default=LORA_MODULES,
        help="LoRA: comma-separated projections or 'all-linear' (default: all seven)",
    )
    a.add_argument("--rslora", action="store_true", help="LoRA: scale by alpha/sqrt(r)")
    a.add_argument("--dropout", type=float, default=0.0, help="LoRA dropout (default 0)")
    a.add_argument(
        "--layers",
        type=_layers,
        default=None,
        help="ReFT: 'all' (default) or comma-separated layer indices",
    )
    a.add_argument(
        "--positions",
        default="prefill",
        help="ReFT: f{n}+l{n}, f{n}, l{n} or prefill (every prompt token; default)",
    )
    a.add_argument(
        "--share-weights",
        action="store_true",
        help="ReFT: one intervention for first and last positions",
    )
    t = p.add_argument_group("optimisation")
    t.add_argument("--epochs", type=int, default=3)
    t.add_argument("--steps", type=int, help="optimizer steps (overrides --epochs)")
    t.add_argument("--batch-size", type=int, default=8, help="examples per step (default 8)")
    t.add_argument(
        "--micro-batch-size",
        type=int,
        help="examples per forward pass; gradients accumulate (default: batch size)",
    )
    t.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default 2e-3)")
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--warmup-steps", type=int, help="default: 5%% of the steps")
    t.add_argument("--schedule", choices=[s.value for s in Schedule], default="cosine")
    t.add_argument("--max-grad-norm", type=float, default=1.0)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    t.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    t.add_argument("--max-seq-len", type=int, default=1024)
    t.add_argument(
        "--overlong",
        choices=[o.value for o in Overlong],
        default="truncate",
        help="longer examples: truncate the response (default), drop them, or error",
    )
    r = p.add_argument_group("progress and checkpoints")
    r.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="steps between evaluations (default: at the end only)",
    )
    r.add_argument(
        "--save-every",
        type=int,
        default=0,
        help="steps between checkpoints in OUT/checkpoints (default: none)",
    )
    r.add_argument("--resume", action="store_true", help="continue from OUT's last checkpoint")
    r.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(local=cmd_train)


def config_from(args: argparse.Namespace) -> TrainConfig:
    spec = AdapterSpec(
        type=AdapterType(args.type),
        mode=AdapterMode(args.mode),
        rank=args.rank,
        alpha=args.alpha,
        target_modules=args.target_modules,
        rslora=args.rslora,
        dropout=args.dropout,
        layers=args.layers,
        positions=args.positions,
        share_weights=args.share_weights,
    )
    for flag in ("epochs", "batch_size"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1")
    return TrainConfig(
        data=args.data,
        model=args.model,
        out=args.out,
        adapter=spec,
        validation=args.validation,
        epochs=args.epochs,
        max_steps=args.steps,
        batch_size=args.batch_size,
        micro_batch_size=args.micro_batch_size,
        learning_rate=args.lr,
        weight_decay=args.weight_decay,
        warmup_steps=args.warmup_steps,
        schedule=Schedule(args.schedule),
        max_grad_norm=args.max_grad_norm,
        seed=args.seed,
        dtype=args.dtype,
        device=args.device,
        max_seq_len=args.max_seq_len,
        overlong=Overlong(args.overlong),
        eval_every=args.eval_every,
        save_every=args.save_every,
        resume=args.resume,
        progress=not args.quiet,
    )


def cmd_train(args: argparse.Namespace) -> int:
    def say(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    try:
        config = config_from(args)
        if not (config.model / "config.json").is_file():
            raise ValueError(
                f"--model {config.model} is not a model directory (no "
                "config.json); prepare one with 'preft model prepare'"
            )
        from preft_serve.training.trainer import train  # imports torch + transformers

        result = train(config, say)
    except (DataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(result.out)
    return 0
