"""RL with a verifiable reward: PreFT LoRA against all-token LoRA from the same start
(the paper's third finding: "on RL, PreFT approaches parity").

    python -m bench.studies.rl_bench [--steps 60] [--quick]
        [--model var/models/smollm2-135m-instruct]

Task: a one-digit number added to a two-digit one ("What is 47 + 8? Answer with the number
only."), reward 1 when the last integer of the answer is the sum, else 0, computed by code
(SmolLM2-135M-Instruct answers "47 + 8 = 55" or starts explaining and runs out of tokens;
it is right 6% of the time on the held-out questions, two-digit sums 4%). Policy
gradient in the GRPO style: each step draws ``--prompts`` questions, samples ``--group``
answers per question at temperature 1, normalises each answer's reward within its group
(advantage = (r - mean) / (std + eps); groups whose answers all score the same teach
nothing and are skipped), and takes one AdamW step on -advantage x mean log-probability of
the answer's tokens (on-policy, one update per batch, so PPO's ratio is 1 and its clip
never acts; no KL term, as in Dr. GRPO / DAPO).

Both adapters are served the way the worker serves them, in sampling *and* in the loss:
PreFT LoRA adapts the prompt's forward pass and decodes with the base weights on that
cache (``LoraAdapter.set_generation_phase``); in the loss its gate is on for prompt tokens
only (the trainer's own mechanism, ``preft train``). All-token LoRA is on everywhere.
Same base model, same initial adapter weights (same seed), same questions, same sampling
seeds per step.

Why not TRL: its GRPOTrainer (1.16 on PyPI) applies a peft adapter to every token, in
generation and in the loss; PreFT needs the adapter gated per token in both, which would
mean patching its generation and forward. This loop reuses the trainer's gated adapters
and is ~200 lines.

Every ``--eval-every`` steps both policies answer ``--eval-questions`` held-out questions
greedily (same semantics); the results file has the reward curve per step and the
held-out accuracy curve, and the plot puts the two configurations side by side.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.results import add_result_dir, result_path

DEFAULT_MODEL = Path("var/models/smollm2-135m-instruct")
NUMBER = re.compile(r"-?\d+")
QUESTION = "What is {a} + {b}? Answer with the number only."


@dataclasses.dataclass(frozen=True)
class Question:
    a: int
    b: int

    @property
    def text(self) -> str:
        return QUESTION.format(a=self.a, b=self.b)

    def reward(self, answer: str) -> float:
        """1 when the answer's last integer is the sum (the verifiable reward)."""
        found = NUMBER.findall(answer)
        return 1.0 if found and int(found[-1]) == self.a + self.b else 0.0


def questions(seed: int, count: int) -> list[Question]:
    rng = random.Random(seed)
    return [Question(rng.randint(10, 99), rng.randint(2, 9)) for _ in range(count)]


@dataclasses.dataclass(frozen=True)
class Plan:
    steps: int = 60
    prompts: int = 4
    group: int = 6
    max_new_tokens: int = 12
    rank: int = 16
    lr: float = 2e-4
    seed: int = 0
    eval_every: int = 10
    eval_questions: int = 48
    modes: tuple[str, ...] = ("prefill", "all")


def prompt_ids(tokenizer: Any, question: Question) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question.text}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def sample(
    model: Any,
    adapter: Any,
    prompts: list[list[int]],
    max_new: int,
    pad: int,
    eos: int,
    generator: Any | None,
) -> list[list[int]]:
    """One answer per prompt (greedy when ``generator`` is None), served semantics: the
    prompt's forward with the adapter, decode steps as the adapter's mode says."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):  # left-padded, so every row's next token is at the end
        ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    answers: list[list[int]] = [[] for _ in prompts]
    done = torch.zeros(len(prompts), dtype=torch.bool)
    with torch.no_grad():
        adapter.set_generation_phase(prefill=True)
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        adapter.set_generation_phase(prefill=False)
        for _ in range(max_new):
            logits = out.logits[:, -1, :].float()
            if generator is None:
                token = logits.argmax(-1)
            else:
                token = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)[:, 0]
            for row in range(len(prompts)):
                if not done[row]:
                    answers[row].append(int(token[row]))
            done |= token == eos
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones(len(prompts), 1, dtype=mask.dtype)], 1)
            positions = positions[:, -1:] + 1
            out = model(
                input_ids=token[:, None],
                attention_mask=mask,
                position_ids=positions,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
    return answers


def advantages(rewards: list[float], group: int) -> list[float]:
    """GRPO's group-normalised advantages (0 for a group whose answers all score alike)."""
    out = []
    for start in range(0, len(rewards), group):
        chunk = rewards[start : start + group]
        mean, std = statistics.fmean(chunk), statistics.pstdev(chunk)
        out += [(r - mean) / (std + 1e-4) if std > 0 else 0.0 for r in chunk]
    return out


def policy_loss(
    model: Any,
    adapter: Any,
    prompts: list[list[int]],
    answers: list[list[int]],
    adv: list[float],
    pad: int,
) -> Any:
    """-advantage x mean log-probability of each answer's tokens, under the served gate."""
    import torch

    from preft_serve.training.batch import IGNORE, collate
    from preft_serve.training.data import Example

    examples = [
        Example(tuple(p), tuple(a), line=i + 1, turn=0)
        for i, (p, a) in enumerate(zip(prompts, answers, strict=True))
    ]
    batch = collate(examples, pad)
    adapter.set_batch(batch)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    labels = batch.labels[:, 1:]
    scored = labels != IGNORE
    token_logp = logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0] * scored
    per_answer = token_logp.sum(1) / scored.sum(1).clamp(min=1)
    return -(torch.tensor(adv) * per_answer).mean()


def accuracy(
    model: Any,
    adapter: Any,
    tokenizer: Any,
    held_out: list[Question],
    max_new: int,
    pad: int,
    eos: int,
) -> float:
    answers = sample(
        model,
        adapter,
        [prompt_ids(tokenizer, q) for q in held_out],
        max_new,
        pad,
        eos,
        generator=None,
    )
    return statistics.fmean(
        q.reward(tokenizer.decode(a, skip_special_tokens=True))
        for q, a in zip(held_out, answers, strict=True)
    )


def run_mode(mode: str, plan: Plan, model_dir: Path, say: Any = print) -> dict[str, Any]:
    """Train one adapter mode from the shared start; its reward and accuracy curves."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from preft_serve.adapters.format import AdapterMode, AdapterType
    from preft_serve.training.adapters import attach_adapter
    from preft_serve.training.spec import AdapterSpec

    torch.manual_seed(plan.seed)  # the same initial adapter weights for every mode
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    for p in model.parameters():
        p.requires_grad_(False)
    adapter = attach_adapter(
        model, AdapterSpec(type=AdapterType.LORA, mode=AdapterMode(mode), rank=plan.rank)
    )
    optimizer = torch.optim.AdamW(adapter.parameters(), lr=plan.lr, weight_decay=0.0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = tokenizer.eos_token_id
    held_out = questions(10_000 + plan.seed, plan.eval_questions)
    curve: list[dict[str, Any]] = []
    evals = [
        {
            "step": 0,
            "accuracy": accuracy(
                model, adapter, tokenizer, held_out, plan.max_new_tokens, pad, eos
            ),
        }
    ]
    say(f"  {mode}: step 0 held-out accuracy {evals[0]['accuracy']:.3f}")
    started = time.perf_counter()
    for step in range(1, plan.steps + 1):
        batch_q = questions(plan.seed * 1_000_003 + step, plan.prompts)
        prompts = [prompt_ids(tokenizer, q) for q in batch_q for _ in range(plan.group)]
        generator = torch.Generator().manual_seed(plan.seed * 7919 + step)
        model.eval()
        answers = sample(model, adapter, prompts, plan.max_new_tokens, pad, eos, generator)
        rewards = [
            q.reward(tokenizer.decode(a, skip_special_tokens=True))
            for q, a in zip([q for q in batch_q for _ in range(plan.group)], answers, strict=True)
        ]
        adv = advantages(rewards, plan.group)
        updated = any(adv)
        if updated:
            loss = policy_loss(model, adapter, prompts, answers, adv, pad)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        curve.append({"step": step, "reward": statistics.fmean(rewards), "updated": updated})
        if step % plan.eval_every == 0 or step == plan.steps:
            evals.append(
                {
                    "step": step,
                    "accuracy": accuracy(
                        model, adapter, tokenizer, held_out, plan.max_new_tokens, pad, eos
                    ),
                }
            )
            say(
                f"  {mode}: step {step}/{plan.steps}, mean reward (last {plan.eval_every}) "
                f"{statistics.fmean(c['reward'] for c in curve[-plan.eval_every :]):.3f}, "
                f"held-out accuracy {evals[-1]['accuracy']:.3f} "
                f"({time.perf_counter() - started:.0f} s)"
            )
    return {
        "mode": mode,
        "reward_curve": curve,
        "accuracy_curve": evals,
        "seconds": round(time.perf_counter() - started, 1),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    window = max(1, result["plan"]["eval_every"] // 2)
    for run in result["runs"]:
        rewards = [c["reward"] for c in run["reward_curve"]]
        smooth = [
            statistics.fmean(rewards[max(0, i - window + 1) : i + 1]) for i in range(len(rewards))
        ]
        axes[0].plot(range(1, len(rewards) + 1), smooth, label=run["mode"])
        axes[1].plot(
            [e["step"] for e in run["accuracy_curve"]],
            [e["accuracy"] for e in run["accuracy_curve"]],
            marker="o",
            label=run["mode"],
        )
    axes[0].set(xlabel="step", ylabel=f"training reward (mean of {window})", ylim=(0, 1))
    axes[1].set(xlabel="step", ylabel="held-out accuracy (greedy)", ylim=(0, 1))
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle(
        "GRPO-style RL on two-digit + one-digit additions, LoRA "
        f"r={result['plan']['rank']}, {result['model']} ({result['when']})",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(result: dict[str, Any]) -> str:
    lines = [
        (
            "| adapter | held-out accuracy: start → end | best | mean training reward, "
            "first / last quarter | wall s |"
        ),
        "|---|---|---:|---|---:|",
    ]
    for run in result["runs"]:
        acc = [e["accuracy"] for e in run["accuracy_curve"]]
        rewards = [c["reward"] for c in run["reward_curve"]]
        quarter = max(1, len(rewards) // 4)
        label = "PreFT LoRA (prefill)" if run["mode"] == "prefill" else "all-token LoRA"
        lines.append(
            f"| {label} | {acc[0]:.3f} → {acc[-1]:.3f} | {max(acc):.3f} | "
            f"{statistics.fmean(rewards[:quarter]):.3f} / "
            f"{statistics.fmean(rewards[-quarter:]):.3f} | {run['seconds']} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.studies.rl_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--steps", type=int, default=Plan.steps)
    p.add_argument("--prompts", type=int, default=Plan.prompts, help="questions per step")
    p.add_argument("--group", type=int, default=Plan.group, help="answers per question")
    p.add_argument("--rank", type=int, default=Plan.rank)
    p.add_argument("--lr", type=float, default=Plan.lr)
    p.add_argument("--seed", type=int, default=Plan.seed)
    p.add_argument("--eval-every", type=int, default=Plan.eval_every)
    p.add_argument("--eval-questions", type=int, default=Plan.eval_questions)
    p.add_argument("--quick", action="store_true", help="6 steps, 8 held-out questions")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results path without suffix (default RESULT_DIR/rl_bench[_quick])",
    )
    add_result_dir(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (args.model / "config.json").exists():
        print(f"error: no model at {args.model}; run `make model` first", file=sys.stderr)
        return 1
    plan = Plan(
        steps=args.steps,
        prompts=args.prompts,
        group=args.group,
        rank=args.rank,
        lr=args.lr,
        seed=args.seed,
        eval_every=args.eval_every,
        eval_questions=args.eval_questions,
    )
    if args.quick:
        plan = dataclasses.replace(plan, steps=6, eval_every=3, eval_questions=8)
    out = args.out or result_path(args.result_dir, "rl_bench_quick" if args.quick else "rl_bench")
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    result: dict[str, Any] = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "model": args.model.name,
        "plan": dataclasses.asdict(plan),
        "runs": [],
    }
    print(
        f"RL (GRPO-style) on {args.model.name}: {plan.steps} steps x {plan.prompts} "
        f"questions x {plan.group} answers, LoRA rank {plan.rank}, lr {plan.lr}",
        flush=True,
    )
    for mode in plan.modes:
        result["runs"].append(run_mode(mode, plan, args.model, say=lambda m: print(m, flush=True)))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(result, indent=2))  # each run as it ends
    print(table(result))
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
