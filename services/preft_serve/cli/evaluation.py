"""``preft adapter evaluation set | show | delete`` and ``preft adapter evaluate``: the
evaluation gate that a staged version must pass before it is promoted.

Bounds are checked here before anything is sent (the registry checks them again);
``evaluate`` needs the gateway's URL, since the gateway serves the examples.
"""

from __future__ import annotations

import argparse
from typing import Any

from preft_serve.cli.client import CliError, Registry
from preft_serve.cli.helptext import with_examples
from preft_serve.cli.ids import adapter_name
from preft_serve.cli.policy import version
from preft_serve.common.evaluation_wire import (
    MAX_EVAL_TOKENS,
    MAX_EXAMPLES,
    MAX_LOSS_MARGIN,
    MAX_SHARE_MARGIN,
    Metric,
)

_METRICS = [m.value for m in Metric]


def margin(text: str) -> float:
    try:
        value = float(text) if len(text) <= 32 else -1.0
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_LOSS_MARGIN:
        raise argparse.ArgumentTypeError(
            f"--margin {text[:32]!r} is invalid: use a share of examples from 0 to "
            f"{MAX_SHARE_MARGIN:g} (exact, contains), e.g. 0.05, or nats per answer token "
            f"from 0 to {MAX_LOSS_MARGIN:g} (loss), e.g. 0.1"
        )
    return value


def max_tokens(text: str) -> int:
    number = int(text) if text.isascii() and text.isdigit() and len(text) <= 6 else 0
    if not 1 <= number <= MAX_EVAL_TOKENS:
        raise argparse.ArgumentTypeError(
            f"--max-tokens {text[:32]!r} is invalid: use 1 to {MAX_EVAL_TOKENS}"
        )
    return number


def _path(name: str) -> str:
    return f"/v1/adapters/{name}/evaluation"


def cmd_set(reg: Registry, args: argparse.Namespace) -> Any:
    if args.metric != Metric.LOSS.value and args.margin > MAX_SHARE_MARGIN:
        raise CliError(
            f"--margin {args.margin:g} is above {MAX_SHARE_MARGIN:g}: for --metric "
            f"{args.metric} it is a share of the examples (margins up to "
            f"{MAX_LOSS_MARGIN:g} are nats, for --metric loss)"
        )
    body = {
        "file_id": args.file,
        "metric": args.metric,
        "margin": args.margin,
        "max_tokens": args.max_tokens,
    }
    return reg.call("PUT", _path(args.name), json=body)


def cmd_evaluate(reg: Registry, args: argparse.Namespace) -> Any:
    body = {"version": args.version, "promote": args.promote}
    try:
        run = reg.call("POST", f"/v1/adapters/{args.name}/evaluations", json=body)
    except CliError as exc:
        if exc.error.get("code") in ("unknown_url", "method_not_allowed"):
            raise CliError(
                f"{reg.url} does not run evaluations ({exc}): the gateway does (it sends "
                "the examples to the workers); pass --url GATEWAY_URL",
                code="not_the_gateway",
                status=exc.status,
            ) from None
        raise
    if args.promote:
        _check_promoted(run, args.name)
    return run


def _check_promoted(run: Any, name: str) -> None:
    """Exit 1 when ``--promote`` left the version unserved (a failed evaluation, or a
    promote refused because the policy changed during the run): `evaluate --promote &&
    ...` must not go on as if it were served. A run of the served version promotes
    nothing and is no failure."""
    if not isinstance(run, dict) or run.get("promoted"):
        return
    number = run.get("version")
    found = run.get("result")
    result: dict[str, Any] = found if isinstance(found, dict) else {}
    if result.get("serving_version") == number:
        return
    if refused := run.get("promote_refused"):
        raise CliError(
            f"version {number} passed its evaluation but was not promoted: {refused}; "
            f"read the policy again (preft adapter policy {name}) and promote it with "
            f"preft adapter promote {name} {number}",
            code="promote_refused",
        )
    raise CliError(
        f"version {number} did not pass its evaluation (score {result.get('score')}, "
        f"served version {result.get('serving_version')}: {result.get('serving_score')}, "
        f"margin {result.get('margin')}), so it was not promoted; the result is stored "
        f"(preft adapter policy {name})",
        code="not_promoted",
    )


def add_evaluation_parsers(a_sub: Any, leaf: Any) -> None:
    ev = a_sub.add_parser(
        "evaluation",
        help="attach, show or detach the evaluation a staged version must pass before it "
        "is promoted",
    )
    ev_sub = ev.add_subparsers(dest="evaluation_action", required=True)
    put = leaf(
        ev_sub,
        "set",
        "Attach an evaluation file (chat JSONL, each line ending with the assistant's "
        f"expected answer, at most {MAX_EXAMPLES} lines; `preft files upload` it first)",
        cmd_set,
    )
    put.add_argument("name", type=adapter_name)
    put.add_argument("--file", required=True, help="the file id (file-...)")
    put.add_argument(
        "--metric",
        choices=_METRICS,
        default=Metric.EXACT.value,
        help="exact or contains: the greedy answer matches the expected one; loss: nats per "
        "token of the expected answer with PreFT semantics (lower is better)",
    )
    put.add_argument(
        "--margin",
        type=margin,
        required=True,
        help="how much worse than the serving version a staged version may score and still "
        "pass: a share of examples (0 to 1) for exact and contains, nats per answer token "
        f"(0 to {MAX_LOSS_MARGIN:g}) for loss",
    )
    put.add_argument(
        "--max-tokens",
        type=max_tokens,
        default=64,
        help=f"tokens per answer (1 to {MAX_EVAL_TOKENS}, default 64; exact and contains)",
    )
    with_examples(
        put,
        "example:\n"
        "  preft adapter evaluation set support-bot --file file-abc123 --metric exact "
        "--margin 0.05\n"
        "  preft adapter evaluation set support-bot --file file-abc123 --metric loss "
        "--margin 0.1",
    )
    show = leaf(
        ev_sub,
        "show",
        "Show the adapter's evaluation (each version's result: `preft adapter policy`)",
        lambda r, a: r.call("GET", _path(a.name)),
    )
    show.add_argument("name", type=adapter_name)
    rm = leaf(
        ev_sub,
        "delete",
        "Detach the evaluation: promotes need no result",
        lambda r, a: r.call("DELETE", _path(a.name)),
    )
    rm.add_argument("name", type=adapter_name)
    run = leaf(
        a_sub,
        "evaluate",
        "Run the evaluation on a version (default: the newest staged) and on the serving "
        "version through the gateway's serving path, store the result, and with "
        "--promote serve the version if it passed (needs the gateway's URL)",
        cmd_evaluate,
    )
    run.add_argument("name", type=adapter_name)
    run.add_argument("--version", type=version, help="the version (default: newest staged)")
    run.add_argument("--promote", action="store_true", help="promote it if it passes")
    with_examples(
        run,
        "examples:\n"
        "  preft adapter upload ./v2 --name support-bot --new-version\n"
        "  preft adapter evaluate support-bot --promote   # served only if it passes\n"
        "  preft adapter policy support-bot               # each version's result",
    )
