"""Fuzz-test plumbing: a summary of the cases sent, per operation and status."""

from __future__ import annotations

import json
import os
from typing import Any

from tests.fuzz.support import EXAMPLES, TALLY


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TALLY:
        return
    tr = terminalreporter
    tr.section(f"API fuzzing ({EXAMPLES} examples per operation)")
    per_op: dict[tuple[str, str], dict[int, int]] = {}
    for (api, op, status), n in sorted(TALLY.items()):
        per_op.setdefault((api, op), {})[status] = n
    for (api, op), statuses in per_op.items():
        shown = " ".join(f"{s}:{n}" for s, n in sorted(statuses.items()))
        tr.write_line(f"  {api:8} {op:45} {sum(statuses.values()):6}  {shown}")
    for api in sorted({a for a, _, _ in TALLY}):
        tr.write_line(f"  {api}: {sum(n for (a, _, _), n in TALLY.items() if a == api)} cases")
    if path := os.environ.get("PREFT_FUZZ_REPORT"):
        rows = [
            {"api": a, "operation": o, "status": s, "cases": n}
            for (a, o, s), n in sorted(TALLY.items())
        ]
        with open(path, "w") as f:
            json.dump({"examples_per_operation": EXAMPLES, "cases": rows}, f, indent=1)
