"""Soak with chaos: the whole stack under steady traffic and tenant changes while its parts
are killed, restarted and paused at random; then checks that nothing was lost, no answer
was wrong, every error is accounted for, every fault recovered, and no resource grew.

The stack, each part a process of its own (``preft_serve.onebox`` runs them): an S3
server (moto), Redis with an append-only file fsynced on every write, the registry on that
S3 store, two CPU workers (vLLM, the toy ``tiny-llama``), the gateway in front of both.
Two tenants upload ``--adapters`` LoRA adapters and bind one user to each; then, for
``--minutes``:

* traffic: chat completions (some streamed) for random bound users at ``--load`` (70%) of
  the capacity measured just before (closed loop, 24 clients), arrivals at random (Poisson);
* tenant changes on both tenants at once: uploads of new adapters, new versions of bound
  ones (hot swaps), rebinds of users, deletes of unbound adapters;
* fine-tuning on the first tenant: short jobs on the toy model (two in flight), one in
  five cancelled 1-40 s after its creation (queued or training);
* clients that leave (``soak-leaving``, :mod:`bench.soak.leaving`): streamed chat
  completions and Responses whose client hangs up right after the headers or mid-stream,
  and, every minute, requests with a field no worker honours (tools without a tool-call
  parser, ``kv_transfer_params`` top-level or in ``vllm_xargs``);
* a hostile tenant (``soak-hostile``, :mod:`bench.soak.hostile`), from the end of the
  first calm window to the end: 128 slow uploads at once through the gateway's
  ``/v1/files`` and ~1 MB ``/tokenize`` calls back to back, under rate limits of its own;
* before any fault, two windows of ``--calm-s`` (30 s for short runs): the load above
  without the hostile tenant, then with it;
* chaos, at random times, one fault at a time, each kind in turn (shuffled rounds): a
  worker SIGKILLed and restarted; the registry SIGKILLed in the middle of an upload and
  restarted; Redis SIGKILLed, down 5 s, restarted from its AOF; the S3 server paused
  (SIGSTOP) for 20 s; a worker paused (SIGSTOP) for 10 s; a trainer SIGKILLed while it
  trains; the registry SIGKILLed while it registers a finished job's adapter (S3 paused
  from the moment the trainer's output is stored, so the registration is caught midway;
  resumed right after the kill). moto keeps its objects in
  memory, so a killed moto would come back empty (a lost disk, not an outage): "S3 down"
  is a pause, which clients see as a server that accepts connections and does not answer.

At the end it checks, prints as a table and writes to ``--out`` (JSON + a timeline plot):
nothing lost (every acknowledged upload listed, downloadable, its sha256 what was sent;
every acknowledged binding resolves; no referenced blob missing; every acknowledged
fine-tuning job ended, an acknowledged cancel kept, every succeeded job's adapter listed
and served, no trainer output left in the store), no wrong answer (another
tenant's adapter, or a version older than one acknowledged before the request was sent,
named by the gateway's ``x-preft-adapter*`` headers), errors accounted for (429, or
502/503 inside a fault's window, with an error envelope; no 500), recovery time per fault,
RSS and open FDs per service; and the tenancy checks: the honest tenants' chat p99 beside
the hostile tenant within 3x the calm window's + 0.5 s and no more 429s than without it,
the hostile tenant's refusals (429/413) naming its own limit, the honest tenant's files and
fine-tuning calls never refused for load, the leaving clients billed at least their
requests, prompts and the deltas they read, every unsupported field a 400 with its code.
Exit status 1 if any check fails.

    python -m bench.soak                 # 20 minutes (make soak)
    python -m bench.soak --minutes 2 --adapters 120 --faults-per-kind 1   # the test's
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.results import add_result_dir, result_path
from bench.soak import verify
from bench.soak.chaos import Chaos, chaos_loop
from bench.soak.churn import Tenants, change_loop
from bench.soak.finetune import FineTuning, verify_jobs
from bench.soak.hostile import Hostile
from bench.soak.journal import Journal, say
from bench.soak.leaving import Leaving, prompt_tokens, usage_totals
from bench.soak.processes import Stack, StackView, monitor, sample
from bench.soak.state import verify_state
from bench.soak.traffic import Client, measure_capacity, open_loop
from bench.stack_setup import make_adapters, seed_tenants
from preft_serve.onebox.seed import create_tenant

HOSTILE_LIMITS = {"tenant_rps": 2.0, "tenant_burst": 4}
"""The hostile tenant's rate limits, as an operator sets a tenant's (the others have none)."""


HOSTILE, LEAVING = "soak-hostile", "soak-leaving"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--minutes", type=float, default=20.0, help="soak length (default 20)")
    p.add_argument("--seed", type=int, default=0, help="chaos schedule and traffic mix")
    p.add_argument(
        "--adapters",
        type=int,
        default=1000,
        help="adapters uploaded and bound before the soak (default 1000)",
    )
    p.add_argument("--load", type=float, default=0.7, help="share of measured capacity")
    p.add_argument(
        "--faults-per-kind",
        type=int,
        default=0,
        help="inject exactly this many faults of each kind (0: as many rounds as fit)",
    )
    p.add_argument(
        "--mutation-interval",
        type=float,
        default=1.5,
        help="seconds between tenant changes, per tenant (default 1.5)",
    )
    p.add_argument(
        "--finetune-interval",
        type=float,
        default=3.0,
        help="seconds between one tenant's fine-tuning moves: keep two jobs "
        "in flight, cancel the one in five due for it (default 3)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="seconds a chaos window extends beyond a fault and its recovery",
    )
    p.add_argument(
        "--swap-grace",
        type=float,
        default=0.0,
        help="seconds after a hot swap's 2xx during which an older version still "
        "counts as right (default 0: none)",
    )
    p.add_argument(
        "--calm-s",
        type=float,
        default=None,
        help="seconds of each comparison window before the chaos: traffic "
        "without the hostile tenant, then with it (default 30 for runs of "
        "5 minutes or less, else 60)",
    )
    p.add_argument(
        "--hostile-uploads",
        type=int,
        default=128,
        help="the hostile tenant's slow uploads at once (default 128)",
    )
    p.add_argument(
        "--leaving-rate",
        type=float,
        default=0.5,
        help="streams per second whose client leaves early (default 0.5)",
    )
    p.add_argument("--var", type=Path, default=Path("var/soak"))
    p.add_argument(
        "--out", type=Path, help="results JSON, a PNG beside it (default RESULT_DIR/soak.json)"
    )
    add_result_dir(p)
    args = p.parse_args(argv)
    args.out = args.out or result_path(args.result_dir, "soak.json")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from preft_serve.toymodels import make_model  # imports torch

    var = args.var.resolve()
    run_s = args.minutes * 60
    # Fresh content for uploads and new versions: about one per change, plus spare.
    changes = int(2 * run_s / args.mutation_interval) + 50
    say(f"[1/6] model and {args.adapters} + {changes} rank-4 adapters in {var}")
    model = make_model("tiny-llama", var / "model").resolve()
    adapters = make_adapters(model, var / "adapters", args.adapters + changes)
    folders = [f for f, _ in adapters]
    stack = Stack(var, model)
    journal = Journal()
    stop, hostile_stop = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []
    try:
        say("[2/6] stack: s3 (moto), redis (AOF), registry, 2 workers, gateway")
        t = time.monotonic()
        stack.start()
        say(f"  up in {time.monotonic() - t:.0f} s")
        say(f"[3/6] 2 tenants, {args.adapters} uploads and bindings")
        bound = seed_tenants(
            StackView(stack),
            adapters[: args.adapters],
            2,  # type: ignore[arg-type]
            prefix="soak",
        )
        keys = [bound[0].api_key, bound[1].api_key]  # adapter i belongs to tenant i % 2
        seeded: list[dict[str, Any]] = [
            {"tenant": i % 2, "name": b.adapter, "user": b.user, "sha": b.sha256}
            for i, b in enumerate(bound)
        ]
        tenants = Tenants(
            stack.urls["registry"], keys, seeded, list(reversed(folders[args.adapters :]))
        )
        hostile_key = create_tenant(stack.urls["registry"], stack.admin_token, HOSTILE)
        httpx.put(
            f"{stack.urls['registry']}/v1/tenants/{HOSTILE}/limits",
            timeout=30,
            json=HOSTILE_LIMITS,
            headers={"Authorization": f"Bearer {stack.admin_token}"},
        ).raise_for_status()
        leaving_key = create_tenant(stack.urls["registry"], stack.admin_token, LEAVING)
        # The short run's jobs are all short, so that jobs end (and registrations happen)
        # within its few minutes even on a machine busy with other work.
        ft = FineTuning(
            tenants,
            0,
            stack.base_model_name,
            journal,
            random.Random(args.seed),
            steps=(10, 20) if args.minutes <= 5 else (10, 20, 40, 200),
            api=stack.urls["gateway"],
        )
        clients = [Client(s["tenant"], keys[s["tenant"]], s["user"]) for s in seeded]
        capacity_s = 10.0 if args.minutes <= 5 else 20.0
        say(f"[4/6] capacity: 24 clients back to back for {capacity_s:.0f} s")
        capacity = measure_capacity(stack.urls["gateway"], clients, capacity_s)
        rate = max(0.5, args.load * capacity)
        say(f"  {capacity:.1f} requests/s; soak at {rate:.1f}/s ({args.load:.0%})")
        # Each prompt's tokens as the API counts them (billed to the first tenant), then
        # the leaving tenant's usage before its clients start.
        tokens = prompt_tokens(stack.urls["gateway"], keys[0], stack.base_model_name)
        billed_before = usage_totals(stack.urls["registry"], leaving_key)
        calm_s = args.calm_s if args.calm_s is not None else (30.0 if args.minutes <= 5 else 60.0)
        say(
            f"[5/6] {calm_s:.0f} s calm, {calm_s:.0f} s with a hostile tenant, then "
            f"{args.minutes:g} min with chaos too (seed {args.seed})"
        )
        rng = random.Random(args.seed)
        journal = Journal()
        ft.journal = journal
        ft.upload_data()
        sample(stack, journal)
        chaos = Chaos(stack, tenants, ft, journal, random.Random(rng.random()), seeded[0]["sha"])
        every = 15.0 if args.minutes <= 5 else 30.0
        threads = [
            threading.Thread(target=monitor, args=(stack, journal, stop, every), daemon=True)
        ]
        threads += [
            threading.Thread(
                target=change_loop,
                daemon=True,
                args=(tenants, t, args.mutation_interval, stop, rng.randrange(1 << 30), journal),
            )
            for t in range(2)
        ]
        threads.append(
            threading.Thread(target=ft.loop, args=(args.finetune_interval, stop), daemon=True)
        )
        leaving = Leaving(
            stack.urls["gateway"],
            leaving_key,
            stack.base_model_name,
            tokens,
            journal,
            random.Random(rng.random()),
            args.leaving_rate,
        )
        threads.append(threading.Thread(target=leaving.run, args=(stop,), daemon=True))
        traffic = threading.Thread(
            target=lambda: asyncio.run(
                open_loop(
                    stack.urls["gateway"], clients, rate, stop, random.Random(rng.random()), journal
                )
            ),
            daemon=True,
        )
        for th in [*threads, traffic]:
            th.start()
        # Two windows without faults, in the same run (this machine's speed varies): the
        # honest load alone, then with the hostile tenant, which stays until the end.
        calm_start = journal.now()
        time.sleep(calm_s)
        hostile_start = journal.now()
        journal.phases["calm"] = [calm_start, hostile_start]
        hostile = threading.Thread(
            target=Hostile(
                stack.urls["gateway"],
                hostile_key,
                stack.base_model_name,
                journal,
                slots=args.hostile_uploads,
            ).run,
            args=(hostile_stop,),
            daemon=True,
        )
        hostile.start()
        time.sleep(calm_s)
        journal.phases["hostile_calm"] = [hostile_start, journal.now()]
        end = time.monotonic() + run_s
        chaos_loop(chaos, args, end, stop, rng)
        while time.monotonic() < end:
            time.sleep(0.5)
        chaos.join(900)  # traffic goes on until every part is back
        hostile_stop.set()
        journal.phases["hostile"] = [hostile_start, journal.now()]
        hostile.join(60)
        stop.set()
        traffic.join(180)
        for th in threads:
            th.join(90)
        sample(stack, journal)
        finished = journal.now()
        say("[6/6] checks: state in the registry and the store, jobs, answers, errors")
        ft.settle(600)
        state = verify_state(stack, tenants, journal)
        state["finetune"] = verify_jobs(ft, stack.urls["gateway"], stack.store())
        time.sleep(verify.BILL_LAG_S)  # the last streams' bills flushed
        after = usage_totals(stack.urls["registry"], leaving_key)
        billed = {k: after[k] - billed_before[k] for k in after}
        result = verify.verdicts(
            args, journal, state, tenants, finished, billed, others=["soak-0", "soak-1", LEAVING]
        )
    finally:
        stop.set()
        hostile_stop.set()
        stack.stop()
    timeline = verify.bins(journal.requests, finished)
    ok_count = result["errors"]["classes"].get("ok", 0)
    summary = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "config": {k: str(v) for k, v in vars(args).items()},
        "capacity_rps": round(capacity, 2),
        "target_rps": round(rate, 2),
        "soak_s": finished,
        "requests": len(journal.requests),
        "client_shed": journal.shed,
        "achieved_ok_rps": round(
            sum(1 for r in journal.requests if verify.ok(r["status"]) and not r["err"]) / finished,
            2,
        ),
        "tenant_changes": dict(Counter(m["k"] for m in journal.mutations)),
        "tenant_changes_acknowledged": dict(
            Counter(m["k"] for m in journal.mutations if verify.ok(m["status"]))
        ),
        "checks": [{"check": n, "result": r, "pass": p} for n, r, p in result["rows"]],
        "passed": result["passed"],
        "state": state,
        "wrong_answers": result["wrong"],
        "errors": result["errors"],
        "recovery": result["recovery"],
        "resources": result["resources"],
        "faults": journal.faults,
        "timeline": timeline,
        "ok_responses_total": ok_count,
        "phases": journal.phases,
        "tenancy": result["tenancy"],
        # Every request or change that did not succeed, for a closer look.
        "failures": [
            r
            for r in [*journal.requests, *journal.mutations, *journal.leaving]
            if not verify.ok(r["status"]) or r.get("err")
        ][:5000],
        "hostile_calls": journal.hostile[:3000],
        "unsupported_probes": journal.probes,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1))
    verify.plot(
        timeline,
        journal.faults,
        f"soak {finished / 60:.1f} min at {rate:.1f} req/s ({args.load:.0%} of "
        f"{capacity:.1f}), {len(journal.faults)} faults: "
        + ("all checks pass" if result["passed"] else "CHECKS FAILED"),
        args.out.with_suffix(".png"),
    )
    say("\n" + verify.table(result["rows"]))
    say(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")
    return 0 if result["passed"] else 1
