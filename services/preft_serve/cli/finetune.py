"""``preft fine-tune ...``: create, list, show, cancel and follow fine-tuning jobs, and list
a job's checkpoints.

``create`` takes a file id, or a path it uploads first; ``events --follow`` (and
``create --follow``) prints each new event and keeps a live progress line on stderr
(step, loss, status) until the job finishes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from preft_serve.cli.client import CliError, Registry
from preft_serve.cli.files import upload
from preft_serve.cli.ids import job_id

FINISHED = ("succeeded", "failed", "cancelled")
JOBS = "/v1/fine_tuning/jobs"


def _file_id(reg: Registry, value: str | None) -> str | None:
    if value is None or value.startswith("file-"):
        return value
    return str(upload(reg, Path(value))["id"])


def cmd_create(reg: Registry, args: argparse.Namespace) -> Any:
    hyper: dict[str, Any] = {}
    for flag, field in (
        ("epochs", "n_epochs"),
        ("batch_size", "batch_size"),
        ("lr_multiplier", "learning_rate_multiplier"),
    ):
        if getattr(args, flag) is not None:
            hyper[field] = getattr(args, flag)
    preft: dict[str, Any] = {"adapter": args.type, "mode": args.mode, "rank": args.rank}
    if args.steps is not None:
        preft["steps"] = args.steps
    if args.promote:
        preft["promote"] = True
    body: dict[str, Any] = {
        "model": args.model,
        "training_file": _file_id(reg, args.training_file),
        "validation_file": _file_id(reg, args.validation_file),
        "suffix": args.suffix,
        "method": {"type": "preft", "preft": preft},
    }
    if hyper:
        body["hyperparameters"] = hyper
    if args.seed is not None:
        body["seed"] = args.seed
    job = reg.call("POST", JOBS, json=body)
    if args.follow:
        return shown(follow(reg, job["id"], args.json), args.json)
    return shown(job, args.json)


def shown(job: dict[str, Any], as_json: bool) -> dict[str, Any]:
    """The raw job under --json; otherwise the fields a person reads."""
    if as_json:
        return job
    out = {
        "id": job["id"],
        "status": job["status"],
        "model": job["model"],
        "fine_tuned": job.get("fine_tuned_model") or "-",
        "file": job["training_file"],
        "tokens": job.get("trained_tokens") or "-",
    }
    if job.get("error"):
        out["error"] = job["error"]["message"]
    return out


def _summary(job: dict[str, Any]) -> str:
    model = job.get("fine_tuned_model") or "-"
    return f"{job['status']:<10} {job['model']} -> {model}"


def cmd_list(reg: Registry, args: argparse.Namespace) -> Any:
    result = _pages(reg, JOBS, args)
    if args.json:
        return result
    table = {j["id"]: _summary(j) for j in result["data"]} or {"jobs": "none"}
    return {**table, **_more(result)}


def _pages(reg: Registry, path: str, args: argparse.Namespace) -> dict[str, Any]:
    """One page after ``--after`` (or the newest), or with ``--all`` every page, joined."""
    params: dict[str, Any] = {"limit": args.limit, **({"after": args.after} if args.after else {})}
    result: dict[str, Any] = reg.call("GET", path, params=params)
    while args.all and result["has_more"] and result["data"]:
        page = reg.call("GET", path, params={**params, "after": result["data"][-1]["id"]})
        result = {**page, "data": result["data"] + page["data"]}
    return result


def _more(result: dict[str, Any]) -> dict[str, str]:
    """The hint to the next page, when the registry has one."""
    if not result.get("has_more") or not result["data"]:
        return {}
    return {"more": f"--after {result['data'][-1]['id']} (or --all)"}


def _line(event: dict[str, Any]) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(event["created_at"]))
    return f"{stamp}  {event['level']:<5}  {event['message']}"


def _progress(job: dict[str, Any], last: dict[str, Any] | None) -> str:
    text = f"{job['status']}"
    if last is not None:
        step, total = last.get("step", 0), last.get("total_steps", 0) or 1
        filled = int(20 * step / total)
        text += (
            f"  [{'#' * filled}{'.' * (20 - filled)}] step {step}/{total}  "
            f"loss {last.get('train_loss', 0):.4f}"
        )
    return text


def follow(reg: Registry, job_id: str, as_json: bool, poll_s: float = 1.0) -> Any:
    """Print events oldest first as they arrive; a live status line on a terminal."""
    live = sys.stderr.isatty() and not as_json
    seen: set[str] = set()
    last: dict[str, Any] | None = None
    while True:
        job = reg.call("GET", f"{JOBS}/{job_id}")
        events = reg.call("GET", f"{JOBS}/{job_id}/events", params={"limit": 100})["data"]
        for event in reversed(events):
            if event["id"] in seen:
                continue
            seen.add(event["id"])
            if event["type"] == "metrics" and event.get("data"):
                last = event["data"]
            if live:
                sys.stderr.write("\r\033[K")
            if not as_json:
                sys.stdout.write(_line(event) + "\n")
                sys.stdout.flush()
        if live:
            sys.stderr.write("\r\033[K" + _progress(job, last))
            sys.stderr.flush()
        if job["status"] in FINISHED:
            if live:
                sys.stderr.write("\n")
            if job["status"] != "succeeded":  # exit 1, under --json too
                error = (job.get("error") or {}).get("message", job["status"])
                raise CliError(f"job {job_id} {job['status']}: {error}", code=job["status"])
            return job
        time.sleep(poll_s)


def cmd_events(reg: Registry, args: argparse.Namespace) -> Any:
    if args.follow:
        return shown(follow(reg, args.job_id, args.json), args.json)
    result = _pages(reg, f"{JOBS}/{args.job_id}/events", args)
    if args.json:
        return result
    for event in reversed(result["data"]):
        sys.stdout.write(_line(event) + "\n")
    return {"events": len(result["data"]), **_more(result)}


def cmd_checkpoints(reg: Registry, args: argparse.Namespace) -> Any:
    params: dict[str, Any] = {"limit": args.limit}
    if args.after:
        params["after"] = args.after
    return reg.call("GET", f"{JOBS}/{args.job_id}/checkpoints", params=params)


def _paging(parser: argparse.ArgumentParser, limit: int, item: str) -> None:
    parser.add_argument("--limit", type=int, default=limit, help=f"page size (default {limit})")
    parser.add_argument("--after", metavar=item, help="the page after this one (older)")
    parser.add_argument("--all", action="store_true", help="fetch every page")


def add_parser(groups: Any, leaf: Any) -> None:
    ft = groups.add_parser(
        "fine-tune", help="fine-tuning jobs (train adapters on the registry's trainers)"
    )
    sub = ft.add_subparsers(dest="action", required=True)
    create = leaf(
        sub, "create", "Create a job; the adapter is registered under --suffix", cmd_create
    )
    create.add_argument("training_file", help="a file id, or a JSONL path to upload first")
    create.add_argument("--model", required=True, help="the served base model's name")
    create.add_argument(
        "--suffix",
        help="the trained adapter's name (a later job with the same suffix adds a version)",
    )
    create.add_argument("--validation-file", help="a file id or a JSONL path")
    create.add_argument("--type", choices=["lora", "direft", "loreft"], default="lora")
    create.add_argument("--mode", choices=["prefill", "all"], default="prefill")
    create.add_argument("--rank", type=int, default=8)
    create.add_argument("--steps", type=int, help="optimizer steps (overrides --epochs)")
    create.add_argument(
        "--epochs", type=int, help="n_epochs (default auto: 3, more for a small file: 16 steps)"
    )
    create.add_argument("--batch-size", type=int, help="examples per step (default auto)")
    create.add_argument(
        "--lr-multiplier", type=float, help="learning_rate_multiplier (x 2e-3; default auto: 1)"
    )
    create.add_argument("--seed", type=int)
    create.add_argument(
        "--promote",
        action="store_true",
        help="serve the trained version to every user at once; default: a later version of "
        "the name is stored staged (`preft adapter evaluate`, `canary` or `promote` it), "
        "and a new name's first version serves",
    )
    create.add_argument("--follow", action="store_true", help="then follow its events")
    ls = leaf(sub, "list", "List your jobs, newest first", cmd_list)
    _paging(ls, 20, "JOB_ID")
    leaf(
        sub, "get", "Show a job", lambda r, a: shown(r.call("GET", f"{JOBS}/{a.job_id}"), a.json)
    ).add_argument("job_id", type=job_id)
    leaf(
        sub,
        "cancel",
        "Cancel a queued or running job",
        lambda r, a: shown(r.call("POST", f"{JOBS}/{a.job_id}/cancel"), a.json),
    ).add_argument("job_id", type=job_id)
    events = leaf(sub, "events", "Show a job's events (oldest first)", cmd_events)
    events.add_argument("job_id", type=job_id)
    _paging(events, 100, "EVENT_ID")
    events.add_argument(
        "--follow",
        action="store_true",
        help="keep printing new events, with a live progress line, until the job finishes",
    )
    checkpoints = leaf(
        sub,
        "checkpoints",
        "List a job's checkpoints, newest first (a "
        "succeeded job has one: the adapter version it registered)",
        cmd_checkpoints,
    )
    checkpoints.add_argument("job_id", type=job_id)
    checkpoints.add_argument("--limit", type=int, default=10, help="page size (1-100, default 10)")
    checkpoints.add_argument(
        "--after", metavar="CHECKPOINT_ID", help="the page after this checkpoint"
    )
