"""A job request's knobs resolved into the trainer's options, every value bounded.

OpenAI's ``hyperparameters`` (top level, or inside ``method.supervised`` / ``method.preft``)
map onto ``preft train``: ``n_epochs`` -> epochs, ``batch_size`` -> examples per step,
``learning_rate_multiplier`` x 2e-3 (the trainer's default peak rate). ``auto`` is a batch
of up to 8 examples, as many epochs as give at least :data:`AUTO_MIN_STEPS` optimizer steps
(3 at the least, 50 at the most), and a multiplier of 1, or 2.5 for a file that small: a few
examples of a person's facts need more passes and a higher rate than a large file (OpenAI's
``auto`` also scales with the file's size).

The PreFT options come from ``method.preft`` (type ``preft``) or the top-level ``preft``
(type ``supervised``, sent with the SDK's ``extra_body``); the job reads back the type it
was sent with, and the options it trained with under ``method.preft`` (with ``promote``,
which the registry reads back from there when it registers the trained version).
"""

from __future__ import annotations

import math
from typing import Any

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.common.domain_errors import InvalidRequest
from preft_serve.common.finetune_wire import Hyperparameters, JobCreate, PreftMethod
from preft_serve.common.text import shown
from preft_serve.training.spec import LORA_MODULES

BASE_LEARNING_RATE = 2e-3
DEFAULT_EPOCHS = 3
MAX_AUTO_EPOCHS = 50
AUTO_MIN_STEPS = 16
"""Optimizer steps ``auto`` trains at the least: on SmolLM2, 16 steps learn a handful of
personal facts well enough to answer phrasings never trained on (docs/fine-tuning.md)."""
DEFAULT_BATCH = 8
SMALL_FILE_MULTIPLIER = 2.5
"""``auto``'s multiplier when the file is small enough that it trains only
:data:`AUTO_MIN_STEPS` steps: the rate measured to learn the demo's facts (5e-3)."""


def _hyperparameters(body: JobCreate, preft: PreftMethod) -> Hyperparameters:
    found = [h for h in (body.hyperparameters, preft.hyperparameters) if h is not None]
    method = body.method
    if method is not None and method.supervised:
        raw = method.supervised.get("hyperparameters")
        if raw is not None:
            try:
                found.append(Hyperparameters.model_validate(raw))
            except ValueError as exc:
                raise InvalidRequest(
                    f"method.supervised.hyperparameters: {exc}"[:500], param="method"
                ) from None
    if len(found) > 1:
        raise InvalidRequest(
            "give hyperparameters once: at the top level or in the method", param="hyperparameters"
        )
    try:
        return (found[0] if found else Hyperparameters()).checked()
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="hyperparameters") from None


def resolve(
    body: JobCreate,
    examples: int,
    seed: int,
    max_steps: int,
    max_lora_rank: int,
    max_reft_rank: int,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(trainer options, the job's ``hyperparameters``, the job's ``method``)."""
    method = body.method
    kind = method.type if method is not None else "preft"
    if method is not None and method.type == "supervised" and method.preft is not None:
        raise InvalidRequest(
            "method.type 'supervised' takes no 'preft' object; send the PreFT "
            "options as the top-level 'preft' (the SDK's extra_body), or use "
            "type 'preft'",
            param="method",
        )
    if method is not None and method.preft is not None and body.preft is not None:
        raise InvalidRequest(
            "give the PreFT options once: in method.preft or the top-level 'preft'", param="preft"
        )
    preft = (method.preft if method is not None else None) or body.preft or PreftMethod()
    hp = _hyperparameters(body, preft)
    if preft.adapter is AdapterType.LORA:
        if preft.rank > max_lora_rank:
            raise InvalidRequest(
                f"method.preft.rank {preft.rank} is over this service's LoRA limit {max_lora_rank}",
                param="method",
            )
        unknown = sorted(set(preft.target_modules or ()) - set(LORA_MODULES))
        if unknown:
            names = ", ".join(shown(name) for name in unknown[:7])
            raise InvalidRequest(
                f"method.preft.target_modules: unknown {names}; use {', '.join(LORA_MODULES)}",
                param="method",
            )
    else:
        if preft.rank > max_reft_rank:
            raise InvalidRequest(
                f"method.preft.rank {preft.rank} is over this service's ReFT limit {max_reft_rank}",
                param="method",
            )
        if preft.mode is not AdapterMode.PREFILL:
            raise InvalidRequest(
                "ReFT adapters are prefill-only: method.preft.mode must be 'prefill'",
                param="method",
            )
    batch = min(DEFAULT_BATCH, examples) if hp.batch_size == "auto" else int(hp.batch_size)
    per_epoch = math.ceil(examples / batch)
    epochs = (
        min(MAX_AUTO_EPOCHS, max(DEFAULT_EPOCHS, math.ceil(AUTO_MIN_STEPS / per_epoch)))
        if hp.n_epochs == "auto"
        else int(hp.n_epochs)
    )
    small = epochs * per_epoch <= AUTO_MIN_STEPS
    multiplier = (
        (SMALL_FILE_MULTIPLIER if small else 1.0)
        if hp.learning_rate_multiplier == "auto"
        else float(hp.learning_rate_multiplier)
    )
    steps = preft.steps or epochs * per_epoch
    if preft.steps:  # the trainer stops at ``steps``: the passes over the data it starts
        epochs = math.ceil(steps / per_epoch)
    if steps > max_steps:
        raise InvalidRequest(
            f"this job would run {steps} optimizer steps; at most {max_steps} "
            "(fewer epochs, a larger batch or method.preft.steps)",
            param="hyperparameters",
        )
    options = {
        "adapter": preft.adapter.value,
        "mode": preft.mode.value,
        "rank": preft.rank,
        "alpha": preft.alpha,
        "target_modules": preft.target_modules,
        "layers": preft.layers,
        "positions": preft.positions,
        "epochs": epochs,
        "steps": preft.steps,
        "batch_size": batch,
        "learning_rate": BASE_LEARNING_RATE * multiplier,
        "seed": seed,
        "max_seq_len": preft.max_seq_len,
    }
    hyper = {"n_epochs": epochs, "batch_size": batch, "learning_rate_multiplier": multiplier}
    shown_preft = {
        **{
            k: options[k]
            for k in (
                "adapter",
                "mode",
                "rank",
                "alpha",
                "target_modules",
                "layers",
                "positions",
                "max_seq_len",
            )
        },
        "steps": steps,
        "hyperparameters": hyper,
        "promote": preft.promote,
    }
    shown_method: dict[str, Any] = {"type": kind, "preft": shown_preft}
    if kind == "supervised":
        shown_method["supervised"] = {"hyperparameters": hyper}
    return options, hyper, shown_method
