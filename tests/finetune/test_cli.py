"""``preft files`` and ``preft fine-tune`` against a real registry over HTTP (the CLI runs
in-process; the trainer is a real process)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from preft_serve.cli.finetune import _progress
from tests.finetune.conftest import Api, chat_jsonl
from tests.support.cli import run_cli


def test_files_and_fine_tune_commands(api: Api, tmp_path: Path, capsys: Any) -> None:
    key = api.tenant("acme")
    common = ("--url", api.url, "--api-key", key)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(chat_jsonl() + b'{"messages": [{"role": "tool", "content": "x"}]}\n')
    code, _, err = run_cli(capsys, *common, "files", "upload", str(bad))
    assert code == 1 and "line 3: message 0 has unknown role 'tool'" in err, err

    data = tmp_path / "facts.jsonl"
    data.write_bytes(chat_jsonl())
    code, out, err = run_cli(
        capsys,
        *common,
        "fine-tune",
        "create",
        str(data),
        "--model",
        "tiny-llama",
        "--suffix",
        "cli-facts",
        "--steps",
        "4",
        "--follow",
    )
    assert code == 0, err
    assert "Step 4/4: training loss=" in out and "The job has successfully completed" in out
    assert "fine_tuned:  cli-facts" in out and "status:      succeeded" in out

    code, out, _ = run_cli(capsys, *common, "fine-tune", "list")
    assert code == 0 and "succeeded" in out and "tiny-llama -> cli-facts" in out
    job_id = out.split(":")[0].strip()
    code, out, _ = run_cli(capsys, *common, "--json", "fine-tune", "get", job_id)
    job = json.loads(out)
    assert job["status"] == "succeeded" and job["method"]["preft"]["steps"] == 4
    code, out, err = run_cli(capsys, *common, "fine-tune", "checkpoints", job_id)
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["ID", "STEP", "CHECKPOINT", "METRICS", "CREATED_AT"]
    assert row.split()[1:3] == ["4", "cli-facts@1"] and "train_loss=" in row
    code, out, _ = run_cli(capsys, *common, "fine-tune", "checkpoints", job_id, "-o", "json")
    assert (
        code == 0
        and json.loads(out)
        == api.call(key, "GET", f"/v1/fine_tuning/jobs/{job_id}/checkpoints").json()
    )
    unknown = "ftjob-" + "x" * 24  # well formed: the registry's 404
    code, _, err = run_cli(capsys, *common, "fine-tune", "checkpoints", unknown)
    assert code == 1 and "(HTTP 404)" in err
    code, _, err = run_cli(capsys, *common, "fine-tune", "checkpoints", "ftjob-nope/../x")
    assert code == 2 and "job ids look like 'ftjob-'" in err  # refused before sending
    code, _, err = run_cli(capsys, *common, "fine-tune", "cancel", job_id)
    assert code == 1 and "already succeeded" in err and "(HTTP 409)" in err
    code, out, _ = run_cli(capsys, *common, "fine-tune", "events", job_id)
    assert code == 0 and out.index("job queued") < out.index("successfully completed")
    code, out, _ = run_cli(capsys, *common, "files", "list")
    assert code == 0 and "fine-tune-results" in out and "facts.jsonl" in out

    # A download to stdout is the content alone; to a file, written whole or not at all.
    (training,) = [f for f in api.call(key, "GET", "/v1/files").json()["data"]
                   if f["filename"] == "facts.jsonl"]  # fmt: skip
    code, out, err = run_cli(capsys, *common, "files", "download", training["id"])
    assert (code, err) == (0, "") and out.encode() == chat_jsonl()
    kept = tmp_path / "kept.jsonl"
    kept.write_bytes(b"mine\n")
    missing = "file-" + "x" * 24
    code, _, err = run_cli(capsys, *common, "files", "download", missing, "--out", str(kept))
    assert code == 1 and "(HTTP 404)" in err
    assert kept.read_bytes() == b"mine\n" and sorted(tmp_path.glob(".kept*")) == []
    code, _, err = run_cli(capsys, *common, "files", "download", training["id"], "--out", str(kept))
    assert code == 0 and kept.read_bytes() == chat_jsonl(), err

    exported = httpx.get(f"{api.url}/metrics", timeout=10).text
    assert 'preft_registry_finetune_jobs_finished_total{status="succeeded"} 1.0' in exported
    assert (
        f"preft_registry_finetune_trained_tokens_total {float(job['trained_tokens'])}" in exported
    )

    # Another job on the same name: version 2 is stored staged, version 1 keeps serving.
    code, out, err = run_cli(
        capsys, *common, "--json", "fine-tune", "create", str(data), "--model", "tiny-llama",
        "--suffix", "cli-facts", "--steps", "1", "--follow",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["method"]["preft"]["promote"] is False
    policy = api.call(key, "GET", "/v1/adapters/cli-facts/policy").json()
    assert policy["version"] == 1 and policy["canary"] is None
    states = {v["version"]: v["state"] for v in policy["versions"]}
    assert states == {1: "serving", 2: "staged"}

    # Each trained version is in the audit log, by the key that created the job.
    (key_id,) = [k["key_id"] for k in api.call(key, "GET", "/v1/keys").json()]
    log = api.call(key, "GET", "/v1/audit", params={"action": "adapter.version"}).json()["data"]
    shas = {v["version"]: v["sha256"] for v in policy["versions"]}
    assert sorted((e["actor"], e["target"], e["before"], e["after"]) for e in log) == [
        (key_id, "cli-facts", None, f"v1:{shas[1]}"),
        (key_id, "cli-facts", None, f"v2:{shas[2]} staged"),
    ]


def test_progress_line() -> None:
    line = _progress({"status": "running"}, {"step": 15, "total_steps": 60, "train_loss": 1.23456})
    assert line == "running  [#####...............] step 15/60  loss 1.2346"
    assert _progress({"status": "queued"}, None) == "queued"
