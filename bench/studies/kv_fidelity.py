"""Does the prompt KV a decode worker receives equal what the prefill worker computed?

The two pools' answers are compared with one worker's at the level of log-probabilities,
not only tokens: every request goes straight to the workers both ways, greedy, with the top
``LOGPROBS`` log-probabilities of every output step:

* **unified**: the prefill worker answers the whole request;
* **pools**: the prefill worker answers the first token and keeps the prompt's KV
  (``do_remote_decode``), the decode worker reads it over NIXL and answers the rest.

KV that arrived intact gives per-step differences at float32 rounding (the two paths run
different attention kernels over the same numbers); KV read before it was complete, or
blocks reused by another request, moves them by orders of magnitude more. Where the tokens
part, the unified worker's top-two gap at that step says whether it was a near tie.
``--concurrency`` > 1 keeps several handoffs in flight, so prefill blocks are freed and
reused while other reads are pending.

    python -m bench.studies.kv_fidelity                       # 72 pairs, 512-2048 tokens
    python -m bench.studies.kv_fidelity --pairs 120 --lengths 512 --concurrency 1

Writes ``kv_fidelity.json`` into ``--result-dir`` (every pair) and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.disagg_bench import start_two_pools, two_pool_stack
from bench.results import add_result_dir, result_path
from bench.stack_setup import make_adapters, seed_tenants, stack_main
from preft_serve.adapters.format import format_model_name
from preft_serve.gateway.handoff import REMOTE_DECODE

LOGPROBS = 5
Step = tuple[int, float, dict[str, float]]  # token id, its log-probability, the top ones


def complete(url: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    if reply.status_code != 200:
        raise RuntimeError(f"{url}: HTTP {reply.status_code} {reply.text[:300]}")
    answer: dict[str, Any] = reply.json()
    return answer


def steps(choice: dict[str, Any]) -> list[Step]:
    logprobs = choice["logprobs"]
    return list(
        zip(choice["token_ids"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True)
    )


def top2_gap(step: Step) -> float | None:
    top = sorted(step[2].values(), reverse=True)
    return top[0] - top[1] if len(top) > 1 else None


def one_pair(
    prefill: str, decode: str, decode_model: str, model: str, prompt: list[int], output: int
) -> dict[str, Any]:
    """The same request both ways; what differs, step by step."""
    common = {
        "model": model,
        "prompt": prompt,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": LOGPROBS,
        "return_token_ids": True,
    }
    unified = steps(
        complete(prefill, {**common, "max_tokens": output, "cache_salt": uuid.uuid4().hex})[
            "choices"
        ][0]
    )
    first = complete(
        prefill,
        {
            **common,
            "max_tokens": 1,
            "cache_salt": uuid.uuid4().hex,
            "kv_transfer_params": REMOTE_DECODE,
        },
    )
    head = first["choices"][0]
    rest = complete(
        decode,
        {
            **common,
            "model": decode_model,
            "prompt": prompt + head["token_ids"],
            "max_tokens": output - 1,
            "kv_transfer_params": first.get("kv_transfer_params"),
        },
    )
    pools = steps(head) + steps(rest["choices"][0])
    parted = next(
        (i for i, (u, p) in enumerate(zip(unified, pools, strict=False)) if u[0] != p[0]), None
    )
    same = parted if parted is not None else min(len(unified), len(pools))
    diffs = [abs(unified[i][1] - pools[i][1]) for i in range(same)]
    gaps = [g for g in map(top2_gap, unified) if g is not None]
    record: dict[str, Any] = {
        "prompt_tokens": len(prompt),
        "handed_off": bool(first.get("kv_transfer_params")),
        "parted_at": parted,
        "max_logprob_diff": max(diffs, default=0.0),
        "min_top2_gap": min(gaps, default=None),
    }
    if parted is not None:
        record["top2_gap_where_parted"] = top2_gap(unified[parted])
    return record


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    parted = [r for r in records if r["parted_at"] is not None]
    gaps = sorted(r["min_top2_gap"] for r in records if r["min_top2_gap"] is not None)
    return {
        "pairs": len(records),
        "all_handed_off": all(r["handed_off"] for r in records),
        "parted": len(parted),
        "max_logprob_diff": max((r["max_logprob_diff"] for r in records), default=0.0),
        "top2_gaps_where_parted": [r.get("top2_gap_where_parted") for r in parted],
        "smallest_top2_gaps": gaps[:5],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pairs", type=int, default=72, help="requests, each sent both ways")
    p.add_argument(
        "--lengths",
        default="512,1024,2048",
        help="prompt lengths in tokens, used in turn (default %(default)s)",
    )
    p.add_argument("--concurrency", type=int, default=4, help="pairs in flight at once")
    p.add_argument("--output", type=int, default=32, help="output tokens per request")
    p.add_argument("--model", default="bench-llama", help="a toy preset (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="prompts' random seed")
    p.add_argument(
        "--var",
        type=Path,
        default=Path("var/kv-fidelity"),
        help="where the stack's state and the toy model live",
    )
    p.add_argument("--out", type=Path, help="results JSON (default RESULT_DIR/kv_fidelity.json)")
    add_result_dir(p)
    args = p.parse_args(argv)
    args.out = args.out or result_path(args.result_dir, "kv_fidelity.json")
    from preft_serve.toymodels import make_model

    var = args.var.resolve()
    model = make_model(args.model, var / args.model)
    lengths = [int(x) for x in args.lengths.split(",")]
    stack, ports = two_pool_stack(var, max(lengths) + args.output + 64)

    def body() -> int:
        print("[1/3] Redis, registry, prefill and decode workers", flush=True)
        decode_url = start_two_pools(stack, model, ports)
        print("[2/3] four PreFT adapters", flush=True)
        users = seed_tenants(
            stack, make_adapters(model, var / "adapters", 4), tenants=1, prefix="kvf"
        )
        decode_model = httpx.get(f"{decode_url}/v1/models").json()["data"][0]["id"]
        rng = random.Random(args.seed)
        jobs = [
            (
                format_model_name(users[i % len(users)].sha256),
                [rng.randrange(3, 250) for _ in range(lengths[i % len(lengths)])],
            )
            for i in range(args.pairs)
        ]
        print(f"[3/3] {args.pairs} pairs, {args.concurrency} at a time", flush=True)
        start = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            records = list(
                pool.map(
                    lambda job: one_pair(
                        stack.worker_url, decode_url, decode_model, job[0], job[1], args.output
                    ),
                    jobs,
                )
            )
        result = {
            "what": "prefill worker alone vs prefill + NIXL + decode worker, straight to the "
            f"workers, greedy, top-{LOGPROBS} log-probabilities of every step",
            "command": "python -m bench.studies.kv_fidelity "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "config": {k: v for k, v in vars(args).items() if k not in ("var", "out")},
            "machine": {"cpus": len(os.sched_getaffinity(0)), "platform": platform.platform()},
            "seconds": round(time.perf_counter() - start, 1),
            "summary": summary(records),
            "pairs": records,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result["summary"], indent=1))
        print(f"wrote {args.out}")
        return 0

    return stack_main(stack, body)


if __name__ == "__main__":
    raise SystemExit(main())
