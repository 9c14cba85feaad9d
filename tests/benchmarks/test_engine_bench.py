"""The engine benchmark end to end: one tiny run checks that its processes (vLLM engines),
its protocol and its JSON fit together. Its logic is tested in ``tests/bench``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_end_to_end_run_writes_rounds_rows_and_plot(tmp_path: Path) -> None:
    """Processes, protocol and JSON fit together (one round, numbers not checked)."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.engine_bench",
            "--model",
            "tiny-llama",
            "--adapters",
            "2",
            "--requests",
            "4",
            "--prompt-len",
            "16",
            "--output-len",
            "4",
            "--rounds",
            "1",
            "--modes",
            "preft-lora",
            "--warmup-requests",
            "2",
            "--max-num-seqs",
            "8",
            "--var",
            str(tmp_path / "var"),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert {r["mode"] for r in result["runs"]} == {"base", "preft-lora"}
    assert {(r["mode"], r["round"]) for r in result["rounds"]} == {("base", 0), ("preft-lora", 0)}
    engine = next(e for e in result["engines"] if e["mode"] == "preft-lora")
    assert engine["slot_bytes"] > 0 and engine["adapter_host_bytes"] > 0
    assert out.with_suffix(".png").stat().st_size > 0
