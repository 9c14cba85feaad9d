"""Do fine-tuning jobs with every hyperparameter ``auto`` learn the demo's facts?

Each demo user's 9 facts (``training.synthetic``) are trained with exactly what a job with
``auto`` hyperparameters resolves to (``registry.finetune.resolve``: 16 steps, batches of
8, the small-file rate), on SmolLM2-135M-Instruct, then every held-out phrasing (never
trained on) is asked through the HF+peft PreFT oracle, the served semantics, and an answer
counts when it contains the fact. Trains in ``WORKDIR``; writes
``RESULT_DIR/auto_hyperparameters.json``.

    python -m bench.experiments.auto_hyperparameters var/auto-hyperparameters
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from bench.results import add_result_dir, result_path
from preft_serve.common.finetune_wire import JobCreate
from preft_serve.registry.finetune.resolve import resolve
from preft_serve.registry.finetune.spec import TrainerSpec, train_config
from preft_serve.training.synthetic import PERSONAS, held_out_pairs, training_records
from tests.engine import oracle
from tests.support.real_model import real_model_dir

USERS = ("alice", "bob")
ANSWER_TOKENS = 24


def one_user(user: str, model: Path, root: Path, tokenizer: Any) -> dict[str, Any]:
    from preft_serve.training.trainer import train

    records = training_records(PERSONAS[user])
    data = root / f"{user}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    body = JobCreate.model_validate({"model": "smollm2", "training_file": "file-x"})
    options, hyper, _ = resolve(
        body, len(records), seed=0, max_steps=10_000, max_lora_rank=64, max_reft_rank=32
    )
    spec = TrainerSpec(job_id=user, model=str(model), training_key="x", options=options)
    start = time.monotonic()
    train(train_config(spec, data, None, root / user))
    seconds = time.monotonic() - start
    rows = []
    for question, fact in held_out_pairs(PERSONAS[user]):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        prompt = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        answer = tokenizer.decode(
            oracle.generate_prefill(model, root / user, prompt, ANSWER_TOKENS),
            skip_special_tokens=True,
        )
        rows.append(
            {
                "question": question,
                "fact": fact.value,
                "answer": answer,
                "right": fact.value.lower() in answer.lower(),
            }
        )
    steps = options["epochs"] * math.ceil(len(records) / options["batch_size"])
    return {
        "hyperparameters": hyper,
        "learning_rate": options["learning_rate"],
        "steps": steps,
        "train_s": round(seconds, 1),
        "held_out": f"{sum(r['right'] for r in rows)}/{len(rows)}",
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.experiments.auto_hyperparameters",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "workdir",
        nargs="?",
        type=Path,
        default=Path("var/auto-hyperparameters"),
        help="training files and adapters (default var/auto-hyperparameters)",
    )
    add_result_dir(p)
    args = p.parse_args(argv)
    root = args.workdir
    from transformers import AutoTokenizer

    root.mkdir(parents=True, exist_ok=True)
    model = real_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    result = {}
    for user in USERS:
        result[user] = one_user(user, model, root, tokenizer)
        shown = {k: v for k, v in result[user].items() if k != "rows"}
        print(user, json.dumps(shown), flush=True)
    out = result_path(args.result_dir, "auto_hyperparameters.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
