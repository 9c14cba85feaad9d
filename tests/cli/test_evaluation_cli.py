"""``preft adapter evaluation set | show | delete``, ``preft adapter evaluate`` and
``preft adapter promote --force`` against a real registry behind a real gateway (its worker
answers every completion with the same text, so both versions score alike and the staged one
passes): what the CLI prints is the registry's own answer, the gate refuses a promote
without a result, and bad input is refused before anything is sent."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli.gateway_cli import adapter_dir, cli_json, login, registry_answer
from tests.gateway import test_tenant_forwarding as forwarding
from tests.gateway.test_evaluation_promote import SPLIT, SplitDuringTheRun
from tests.gateway.test_tenant_forwarding import Stack
from tests.support.cli import run_cli

model_dir, stack = forwarding.model_dir, forwarding.stack
NOWHERE = "http://127.0.0.1:9"
EXAMPLES = 3


def staged_with_evaluation(
    s: Stack, capsys: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> tuple[str, Callable[..., Any], dict[str, Any], dict[str, Any]]:
    """Tenant acme logged in, adapter ``bot`` serving version 1 with version 2 staged and
    an evaluation attached (all through the CLI): the key, the upload command, version 2's
    upload answer and the evaluation's configuration."""
    key = s.registry.tenant("acme")
    login(s, key, capsys, monkeypatch, "acme")

    def upload(seed: int, *flags: str) -> Any:
        folder = str(adapter_dir(tmp_path, seed))
        return cli_json(capsys, "adapter", "upload", folder, "--name", "bot", "--quiet", *flags)

    upload(1, "--mode", "prefill")
    v2 = upload(2, "--new-version")
    data = tmp_path / "eval.jsonl"
    line = {
        "messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    }
    data.write_text((json.dumps(line) + "\n") * EXAMPLES)
    file_id = cli_json(capsys, "files", "upload", str(data))["id"]
    config = cli_json(
        capsys, "adapter", "evaluation", "set", "bot", "--file", file_id, "--margin", "0.1"
    )
    return key, upload, v2, config


def test_set_show_evaluate_promote_and_force(
    stack: Callable[..., Stack],
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    s = stack()
    key, upload, v2, config = staged_with_evaluation(s, capsys, monkeypatch, tmp_path)
    assert config == registry_answer(s, key, "/v1/adapters/bot/evaluation")
    assert (config["metric"], config["margin"], config["examples"]) == ("exact", 0.1, EXAMPLES)
    assert cli_json(capsys, "adapter", "evaluation", "show", "bot") == config

    # The gate: no result yet.
    code, _out, err = run_cli(capsys, "adapter", "promote", "bot", "2")
    assert code == 1 and "(HTTP 409)" in err and "no evaluation result" in err, err
    assert registry_answer(s, key, "/v1/adapters/bot/policy")["version"] == 1

    # An inference key may chat but not run an evaluation (it would change the policy).
    made = s.registry.call(key, "POST", "/v1/keys", json={"role": "inference"})
    assert made.status_code == 201, made.text
    denied = s.call(made.json()["api_key"], "POST", "/v1/adapters/bot/evaluations", json={})
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "insufficient_role"

    run = cli_json(capsys, "adapter", "evaluate", "bot", "--promote")
    assert (run["version"], run["promoted"]) == (2, True)
    assert (run["result"]["score"], run["result"]["serving_score"]) == (1.0, 1.0)
    policy = registry_answer(s, key, "/v1/adapters/bot/policy")
    assert (policy["version"], policy["sha256"]) == (2, v2["sha256"])
    assert {v["version"]: v["evaluation"] for v in policy["versions"]}[2] == run["result"]
    code, out, err = run_cli(capsys, "adapter", "policy", "bot")
    assert code == 0, err
    cells = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line[:1].isdigit()}
    assert cells == {"1": "-", "2": "passed:1.00/v1:1.00"}  # the table's evaluation column

    # Version 3 staged: --force promotes it without a result.
    upload(3, "--new-version")
    forced = cli_json(capsys, "adapter", "promote", "bot", "3", "--force")
    assert forced["version"] == 3
    assert cli_json(capsys, "adapter", "evaluation", "delete", "bot") == config
    code, _out, err = run_cli(capsys, "adapter", "evaluation", "show", "bot")
    assert code == 1 and "(HTTP 404)" in err


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["evaluation", "set", "bot", "--file", "file-x", "--margin", "10.5"], "--margin"),
        (["evaluation", "set", "bot", "--file", "file-x", "--margin", "11", "--metric", "loss"],
         "nats per answer token"),
        (["evaluation", "set", "bot", "--file", "file-x", "--margin", "0.1", "--metric", "f1"],
         "invalid choice"),
        (["evaluation", "set", "bot", "--file", "file-x", "--margin", "0", "--max-tokens", "0"],
         "--max-tokens"),
        (["evaluate", "bot", "--version", "0"], "use a version number"),
        (["evaluate", "bad name!"], "adapter name"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_before_sending(
    capsys: Any, argv: list[str], fragment: str
) -> None:
    code, out, err = run_cli(capsys, "adapter", *argv, "--url", NOWHERE, "--api-key", "pft_x.y")
    assert code == 2, (out, err)
    assert fragment in err and "cannot reach" not in err, err


def test_a_share_margin_above_one_is_refused_before_sending(capsys: Any) -> None:
    """Margins up to 10 parse (nats, for loss); exact and contains take a share."""
    argv = ["evaluation", "set", "bot", "--file", "file-x", "--margin", "1.5"]
    code, out, err = run_cli(capsys, "adapter", *argv, "--url", NOWHERE, "--api-key", "pft_x.y")
    assert code == 1, (out, err)
    assert "for --metric exact it is a share of the examples" in err, err
    assert "cannot reach" not in err


def test_evaluate_promote_exits_1_when_the_policy_changed_during_the_run(
    stack: Callable[..., Stack],
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The run's promote is refused (another client set a split meanwhile): the version
    passed, but a script chaining ``evaluate --promote && ...`` must not go on."""
    workers = SplitDuringTheRun()
    s = stack(workers=workers)
    key, _upload, _v2, _config = staged_with_evaluation(s, capsys, monkeypatch, tmp_path)
    workers.split = lambda: s.registry.call(key, "PUT", "/v1/adapters/bot/policy", json=SPLIT)
    code, out, err = run_cli(capsys, "adapter", "evaluate", "bot", "--promote")
    assert code == 1, (out, err)
    assert "version 2 passed its evaluation but was not promoted" in err, err
    assert "changed since it was read" in err and "preft adapter promote bot 2" in err, err
    policy = registry_answer(s, key, "/v1/adapters/bot/policy")
    assert (policy["version"], policy["canary"]["version"]) == (1, 2)  # the split stands
    result = {v["version"]: v["evaluation"] for v in policy["versions"]}[2]
    assert result["passed"] is True  # the result was recorded all the same
