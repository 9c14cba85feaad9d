"""The gateway A/B harness measures what it says: run against its own code (``--before
HEAD`` with a clean tree is the same gateway twice), both sides must come out alike, each
with a real CPU cost, and the results must be written. A harness that read the wrong
process, timed the warm-up or mixed the sides up would give a ratio far from 1.

The bounds are loose on purpose (the machine is shared and noisy); this checks the
harness, not the gateway's speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_same_gateway_on_both_sides_comes_out_alike(tmp_path: Path) -> None:
    out = tmp_path / "ab"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.gateway_ab",
            "--before",
            "HEAD",
            "--adapters",
            "4",
            "--rounds",
            "3",
            "--requests",
            "80",
            "--pairs",
            "30",
            "--var",
            str(tmp_path / "var"),
            "--out",
            str(out),
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.with_suffix(".json").read_text())
    tp = result["throughput"]
    assert len(tp["rounds"]) == 3  # the warm-up is not one of them
    for side in ("now", "before"):
        # A proxied request costs the gateway real CPU, and less than the whole round's time.
        assert 0.1 < tp[f"{side}_cpu_ms_per_request"] < 50, tp
        assert tp[f"{side}_rps"] > 0
    assert 0.5 < tp["cpu_after_over_before"] < 2.0, tp
    assert out.with_suffix(".png").stat().st_size > 0
    assert "now (this tree)" in out.with_suffix(".md").read_text()
