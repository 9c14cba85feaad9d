"""The two-pool benchmark measures what it says. Its quick mode on the toy model: every
measured request (warm-up excluded) moved its prompt's KV over NIXL, the bytes moved per
prompt token are the same at every length (the KV of one token has one size: a run that
counted the warm-up or read the wrong worker would not show it), and the two pools'
answers were the unified worker's (the benchmark fails otherwise). Timing bounds are
loose on purpose: the machine is shared and noisy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_measures_every_handoff(tmp_path: Path) -> None:
    out = tmp_path / "disagg"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.disagg_bench",
            "--quick",
            "--model",
            "tiny-llama",
            "--adapters",
            "2",
            "--var",
            str(tmp_path / "var"),
            "--out",
            str(out),
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.with_suffix(".json").read_text())
    rows = result["rows"]
    assert [r["prompt_tokens"] for r in rows] == result["config"]["lengths"] == [64, 256]
    measured = result["config"]["rounds"] - result["config"]["warmup_rounds"]
    for row in rows:
        assert row["requests"] == row["transfers"] == measured, row
        # Each transfer happens inside its request: the transfers' total (their mean x
        # count) stays under the requests' total time. A mean against the e2e median does
        # not hold when one of three requests is slow.
        transfers_ms = row["transfer_ms"] * row["transfers"]
        assert 0 < transfers_ms < sum(row["pools_samples_ms"]["e2e"]), row
        for mode in ("unified", "pools"):
            assert 0 < row[f"{mode}_ttft_ms"] < row[f"{mode}_e2e_ms"], row
    per_token = [r["transfer_mb_per_1k_tokens"] for r in rows]
    assert per_token[0] > 0 and abs(per_token[1] / per_token[0] - 1) < 0.1, per_token
    assert out.with_suffix(".png").stat().st_size > 0
    assert "transfer ms / 1k tok" in out.with_suffix(".md").read_text()
