"""What the CLI prints: tables, key/value blocks, JSON, errors and progress bars.

Results go to stdout; warnings, errors (except under ``--output json``) and progress bars
go to stderr, so JSON output is always one clean JSON document.
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import IO, Any

from preft_serve.cli.client import CliError

# The registry's messages speak REST; the CLI says the flag or command that does the same.
_CLI_TERMS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\?force=true"), "--force"),
    (re.compile(r"\?strict=true"), "--strict"),
    (
        re.compile(r"upload a new version with PUT /v1/adapters/(\S+)"),
        r"upload a new version with `preft adapter upload PATH --name \1 --new-version`",
    ),
    (
        re.compile(r"issue a new key with POST /v1/tenants/(\S+)/keys"),
        r"issue a new key with `preft tenant new-key \1`",
    ),
    (
        re.compile(r"as GET /v1/tenants/\{tenant\}/keys lists them"),
        "as `preft tenant show TENANT` lists them",
    ),
    (re.compile(r"^field 'mode' is required"), "--mode is required"),
    (
        re.compile(r"\(POST /v1/keys with role admin\)"),
        "(`preft key create --role admin`)",
    ),
)


def cli_terms(message: str) -> str:
    for pattern, replacement in _CLI_TERMS:
        message = pattern.sub(replacement, message)
    return message


def report_error(exc: CliError, as_json: bool) -> int:
    """Print ``exc`` and return the exit status (1).

    Under ``--output json``: ``{"error": {...}}`` on stdout, the registry's envelope body as it
    sent it (plus ``http_status``), or the CLI's own ``code``/``message``/``details``.
    """
    if as_json:
        error = dict(exc.error)
        if exc.status is not None:
            error["http_status"] = exc.status
        sys.stdout.write(json.dumps({"error": error}, indent=2) + "\n")
    else:
        suffix = f" (HTTP {exc.status})" if exc.status is not None else ""
        sys.stderr.write(f"error: {cli_terms(exc.message)}{suffix}\n")
    return 1


def progress_bar(total: int, desc: str, show: bool) -> Any:
    """A tqdm byte counter on stderr (rate and ETA), or ``None`` when not shown."""
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(
        total=total or None,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        dynamic_ncols=True,
        leave=True,
    )


def show_progress(flag_progress: bool, quiet: bool) -> bool:
    """``--progress`` always, ``--quiet`` never, otherwise only on a terminal."""
    return not quiet and (flag_progress or sys.stderr.isatty())


def print_table(rows: list[dict[str, Any]], columns: list[str], out: IO[str]) -> None:
    widths = [max([len(c)] + [len(str(r.get(c, ""))) for r in rows]) for c in columns]
    out.write("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip() + "\n")
    for r in rows:
        out.write(
            "  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(columns, widths)).rstrip() + "\n"
        )


def _fields(result: dict[str, Any], out: IO[str]) -> None:
    for key, value in result.items():
        if key == "warnings":
            continue  # printed on stderr by the command
        out.write(f"{key + ':':<13}{value}\n")


def _usage(result: dict[str, Any], out: IO[str]) -> None:
    """One row per day and model, then the range's totals (a breakdown: one row per bucket
    and name)."""
    if "buckets" in result:
        _usage_breakdown(result, out)
        return
    columns = ["date", "model", "requests", "prompt_tokens", "completion_tokens"]
    rows = [{"date": day["date"], **model} for day in result["days"] for model in day["models"]]
    totals = {c: sum(r[c] for r in rows) for c in columns[2:]}
    print_table([*rows, {"date": "total", "model": "", **totals}], columns, out)
    out.write(f"({result['tenant']}, {result['start']} .. {result['end']}, UTC days)\n")


def _usage_breakdown(result: dict[str, Any], out: IO[str]) -> None:
    """Per version also the errors after the version was chosen and the mean time to first
    token of its streamed requests (the total's mean weighs every stream alike)."""
    by, group_by = result["by"], result["group_by"]
    counted = ["requests", "prompt_tokens", "completion_tokens"]
    if by == "version":
        counted.append("errors")
    columns = [group_by, by, *counted]
    rows = []
    streams, ttft_sum = 0, 0.0
    for bucket in result["buckets"]:
        start = bucket["start"][: 10 if group_by == "day" else 16]
        named = [(item["name"], item) for item in bucket["items"]]
        named += [
            (f"({extra})", bucket[extra]) for extra in ("no_user", "other") if extra in bucket
        ]
        for name, counts in named:
            row = {group_by: start, by: name, **{c: counts.get(c, 0) for c in counted}}
            if by == "version":
                row["ttft_ms_mean"] = _mean_ms(counts.get("ttft_seconds_sum"), counts)
                streams += counts.get("ttft_count") or 0
                ttft_sum += counts.get("ttft_seconds_sum") or 0.0
            rows.append(row)
    totals: dict[str, Any] = {c: sum(r[c] for r in rows) for c in counted}
    if by == "version":
        columns.append("ttft_ms_mean")
        totals["ttft_ms_mean"] = _mean_ms(ttft_sum, {"ttft_count": streams})
    print_table([*rows, {group_by: "total", by: "", **totals}], columns, out)
    bound = result["bounds"]["named_per_bucket"]
    out.write(
        f"({result['tenant']}, {result['since']} .. {result['until']}, UTC {group_by}s; "
        f"(other): the {by}s past the first {bound} of a {group_by})\n"
        if by in ("user", "key")
        else f"({result['tenant']}, {result['since']} .. {result['until']}, UTC {group_by}s)\n"
    )


def _mean_ms(seconds: float | None, counts: dict[str, Any]) -> str:
    """Mean milliseconds over ``counts["ttft_count"]`` streams; ``-`` without any."""
    n = counts.get("ttft_count") or 0
    return f"{seconds / n * 1000:.1f}" if n and seconds is not None else "-"


def _audit(result: dict[str, Any], out: IO[str]) -> None:
    """One row per entry: when, who, what, and the change (``-`` where a side is none)."""
    if not result["data"]:
        out.write("no audit entries\n")
    else:
        rows = [
            {**e, "change": f"{e.get('before') or '-'} \u2192 {e.get('after') or '-'}"}
            for e in result["data"]
        ]
        print_table(rows, ["time", "actor", "action", "target", "change"], out)
    if result["next_cursor"]:
        out.write(f"(more: --all, or --after {result['next_cursor']})\n")


def _checkpoints(result: dict[str, Any], out: IO[str]) -> None:
    """One row per checkpoint: its step, the adapter version it is, its final metrics."""
    if not result["data"]:
        out.write("no checkpoints (a job has one once it succeeds)\n")
        return
    rows = [
        {
            "id": c["id"],
            "step": c["step_number"],
            "checkpoint": c["fine_tuned_model_checkpoint"],
            "metrics": " ".join(f"{k}={v:.4g}" for k, v in sorted(c["metrics"].items())),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(c["created_at"])),
        }
        for c in result["data"]
    ]
    print_table(rows, ["id", "step", "checkpoint", "metrics", "created_at"], out)
    if result["has_more"]:
        out.write(f"(more: --after {rows[-1]['id']})\n")


KEY_COLUMNS = ["key_id", "role", "name", "created_at", "expires_at", "last_used_at", "created_by"]


def _key_rows(keys: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``-`` for an unset field (no name, never expires, never used)."""
    return [{c: "-" if k.get(c) is None else k[c] for c in KEY_COLUMNS} for k in keys]


def _key_created(result: dict[str, Any], out: IO[str]) -> None:
    for key, value in _key_rows([result])[0].items():
        if key != "last_used_at":
            out.write(f"{key + ':':<13}{value}\n")
    out.write(f"{'api_key:':<13}{result['api_key']}\n")


def _policy(result: dict[str, Any], out: IO[str]) -> None:
    """The served version, the canary, the user's pick (with --user), then every version."""
    out.write(f"{'name:':<13}{result['name']}\n")
    out.write(f"{'serving:':<13}version {result['version']} ({result['sha256'][:12]})\n")
    canary = result.get("canary")
    out.write(
        f"{'canary:':<13}"
        + (
            f"version {canary['version']} ({canary['sha256'][:12]}) for "
            f"{canary['weight']:.2%} of users\n"
            if canary
            else "none\n"
        )
    )
    if result.get("user"):
        pick = result["user"]
        out.write(
            f"{'user:':<13}{pick['user']} gets version {pick['version']} ({pick['variant']})\n"
        )
    out.write(f"{'updated_at:':<13}{result['updated_at']}\n")
    out.write("versions:\n")
    rows = [
        {**v, "sha256": v["sha256"][:12], "evaluation": _evaluation(v.get("evaluation"))}
        for v in result["versions"]
    ]
    print_table(
        rows,
        ["version", "state", "sha256", "mode", "rank", "size_bytes", "created_at", "evaluation"],
        out,
    )


def _evaluation(result: dict[str, Any] | None) -> str:
    """A version's last evaluation in one cell: verdict, its score against the serving one."""
    if not result:
        return "-"
    verdict = "passed" if result["passed"] else "failed"
    versus = (
        f"/v{result['serving_version']}:{result['serving_score']:.2f}"
        if result.get("serving_version") is not None
        else ""
    )
    return f"{verdict}:{result['score']:.2f}{versus}"


QUIET = object()
"""A command's result when it wrote its own output (a download to stdout): nothing more."""


def render(result: Any, command: str, out: IO[str]) -> None:
    """Human output of one command's result."""
    if command == "adapter list":
        print_table(
            result["items"],
            ["name", "version", "type", "mode", "rank", "bound_users", "sha256"],
            out,
        )
        if result["next_cursor"]:
            out.write(f"(more: --cursor {result['next_cursor']}, or --all)\n")
    elif command == "adapter show":
        for key in (
            "name",
            "version",
            "sha256",
            "type",
            "rank",
            "mode",
            "base_model",
            "size_bytes",
            "bound_users",
            "created_at",
            "updated_at",
        ):
            out.write(f"{key + ':':<13}{result[key]}\n")
        out.write("versions:\n")
        print_table(result["versions"], ["version", "sha256", "mode", "created_at"], out)
    elif command == "key list":
        print_table(_key_rows(result), KEY_COLUMNS, out) if result else out.write("no keys\n")
    elif command == "key show":
        for key, value in _key_rows([result])[0].items():
            out.write(f"{key + ':':<13}{value}\n")
    elif command == "key create":
        _key_created(result, out)
    elif command in ("adapter policy", "adapter promote", "adapter canary"):
        _policy(result, out)
    elif command == "user list":
        print_table(result["items"], ["user", "adapter"], out)
        if result["next_cursor"]:
            out.write(f"(more: --cursor {result['next_cursor']}, or --all)\n")
    elif command == "usage show":
        _usage(result, out)
    elif command == "audit show":
        _audit(result, out)
    elif command == "fine-tune checkpoints":
        _checkpoints(result, out)
    elif command == "tenant list":
        rows = [
            {
                **t,
                **{
                    f"quota_{k}": ("default" if v is None else v)
                    for k, v in (t.get("quota") or {}).items()
                },
            }
            for t in result
        ]
        print_table(
            rows,
            ["name", "adapters", "quota_max_adapters", "quota_max_stored_bytes", "created_at"],
            out,
        )
    elif isinstance(result, dict):
        _fields(result, out)
