"""Every tenant command of ``preft`` against the gateway's URL alone (a context that names no
registry): adapters, users, usage, files, fine-tuning, the audit log and keys reach a real
registry behind a real gateway, and print what the registry itself answers for the same
key. The operator's tenant commands, sent to a gateway, say to use the registry's URL."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli.gateway_cli import adapter_dir, cli_json, login, registry_answer
from tests.fuzz.support import lora_files
from tests.gateway import test_tenant_forwarding as forwarding
from tests.gateway.test_tenant_forwarding import BASE, Stack
from tests.support.cli import run_cli
from tests.support.gateway import MSGS

# The real registry and gateway of the forwarding tests (fixtures, found by name).
model_dir, stack = forwarding.model_dir, forwarding.stack


def test_every_tenant_command_works_against_the_gateway_alone(
    stack: Callable[..., Stack],
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    config_home: Path,
) -> None:
    s = stack()
    acme, globex = s.registry.tenant("acme"), s.registry.tenant("globex")
    login(s, globex, capsys, monkeypatch, "globex")
    login(s, acme, capsys, monkeypatch, "acme")  # current from here on
    saved = (config_home / "preft" / "config.yaml").read_text()
    assert s.gateway in saved and s.registry.url not in saved  # the gateway's URL only

    # Adapters: upload, a new version, list, show, download, rollback.
    code, out, err = run_cli(
        capsys, "adapter", "upload", str(adapter_dir(tmp_path, 1)), "--name", "bot", "--mode",
        "prefill", "--quiet",
    )  # fmt: skip
    assert code == 0, err
    code, out, err = run_cli(
        capsys, "adapter", "upload", str(adapter_dir(tmp_path, 2)), "--name", "bot",
        "--new-version", "--promote", "--quiet",
    )  # fmt: skip
    assert code == 0, err
    assert cli_json(capsys, "adapter", "list") == registry_answer(s, acme, "/v1/adapters")
    shown = cli_json(capsys, "adapter", "show", "bot")
    assert shown == registry_answer(s, acme, "/v1/adapters/bot") and shown["version"] == 2
    out_dir = tmp_path / "exported"
    code, out, err = run_cli(
        capsys, "adapter", "download", "bot", "--version", "1", "--out", str(out_dir), "--quiet"
    )
    assert code == 0, err
    assert (out_dir / "adapter_model.safetensors").read_bytes() == lora_files(1)[1]
    code, out, err = run_cli(capsys, "adapter", "rollback", "bot", "1")
    assert code == 0, err
    assert registry_answer(s, acme, "/v1/adapters/bot")["version"] == 3

    # Users.
    code, out, err = run_cli(capsys, "user", "bind", "alice", "bot")
    assert code == 0, err
    assert cli_json(capsys, "user", "show", "alice") == registry_answer(s, acme, "/v1/users/alice")
    assert cli_json(capsys, "user", "list") == registry_answer(s, acme, "/v1/users")

    # Another tenant's objects are not found, through the gateway as directly.
    code, out, err = run_cli(capsys, "--context", "globex", "adapter", "show", "bot")
    assert code == 1 and "bot" in err, (out, err)
    code, out, err = run_cli(capsys, "--context", "globex", "user", "show", "alice")
    assert code == 1 and "alice" in err, (out, err)
    assert cli_json(capsys, "--context", "globex", "adapter", "list")["items"] == []

    # Files and fine-tuning.
    data = tmp_path / "train.jsonl"
    line = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}
    data.write_text(json.dumps(line) + "\n")
    uploaded = cli_json(capsys, "files", "upload", str(data))
    assert cli_json(capsys, "files", "list") == registry_answer(s, acme, "/v1/files")
    assert uploaded["id"] in {f["id"] for f in registry_answer(s, acme, "/v1/files")["data"]}
    assert cli_json(capsys, "fine-tune", "list") == registry_answer(s, acme, "/v1/fine_tuning/jobs")

    # Usage: a chat through the same URL, then the per-day report and a breakdown.
    answer = s.call(
        acme,
        "POST",
        "/v1/chat/completions",
        json={"model": BASE, "messages": MSGS, "user": "alice"},
    )
    assert answer.status_code == 200, answer.text
    tokens = answer.json()["usage"]
    deadline = time.monotonic() + 10
    while not cli_json(capsys, "usage", "--by", "user")["buckets"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    breakdown = cli_json(capsys, "usage", "--by", "user", "--group-by", "hour")
    assert breakdown == registry_answer(s, acme, "/v1/usage", by="user", group_by="hour")
    (bucket,) = breakdown["buckets"]
    assert bucket["items"] == [
        {
            "name": "alice",
            "requests": 1,
            "prompt_tokens": tokens["prompt_tokens"],
            "completion_tokens": tokens["completion_tokens"],
        }
    ]
    code, out, err = run_cli(capsys, "usage", "--by", "user", "--group-by", "hour")
    assert code == 0, err
    row = next(r for r in out.splitlines() if "alice" in r).split()
    assert row[-3:] == ["1", str(tokens["prompt_tokens"]), str(tokens["completion_tokens"])]
    assert cli_json(capsys, "usage") == registry_answer(s, acme, "/v1/usage")
    code, out, err = run_cli(capsys, "usage", "--by", "user", "--start", "2026-01-01")
    assert code == 1 and "since/until" in err

    # The audit log and the tenant's own keys.
    audit = cli_json(capsys, "audit", "--all")
    assert audit["data"] == registry_answer(s, acme, "/v1/audit", limit=500)["data"]
    assert {"adapter.upload", "binding.set", "file.upload"} <= {e["action"] for e in audit["data"]}

    # The operator's commands are the registry's: a gateway's URL says so.
    monkeypatch.setenv("PREFT_ADMIN_TOKEN", "whatever")
    code, out, err = run_cli(capsys, "tenant", "list", "--url", s.gateway)
    assert code == 1 and "registry's URL, not the gateway's" in err, err
    assert "the gateway has no admin token configured" in err  # the gateway's own reason
