"""The ``preft`` CLI's output formats and shell completion, without a registry: the REST
calls are answered by a stub."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from preft_serve.cli import build_parser
from preft_serve.cli.client import Registry
from preft_serve.cli.completion import script
from tests.support.cli import run_cli

CHECKPOINTS = {
    "object": "list",
    "has_more": True,
    "first_id": "ftckpt-2",
    "last_id": "ftckpt-2",
    "data": [
        {
            "id": "ftckpt-2",
            "object": "fine_tuning.job.checkpoint",
            "created_at": 1767225600,
            "fine_tuned_model_checkpoint": "carol@2",
            "fine_tuning_job_id": "ftjob-000000000000000000000002",
            "step_number": 16,
            "metrics": {"step": 16.0, "train_loss": 0.012345},
        }
    ],
}
JOB = {
    "id": "ftjob-000000000000000000000002",
    "status": "succeeded",
    "model": "base",
    "fine_tuned_model": "carol",
    "training_file": "file-000000000000000000000001",
    "trained_tokens": 480,
    "error": None,
    "seed": 7,
}


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, dict[str, Any]]]:
    """Every REST call the CLI makes; answered with CHECKPOINTS or JOB by path."""
    made: list[tuple[str, str, dict[str, Any]]] = []

    def call(self: Registry, method: str, path: str, **kwargs: Any) -> Any:
        made.append((method, path, kwargs))
        return json.loads(json.dumps(CHECKPOINTS if path.endswith("/checkpoints") else JOB))

    monkeypatch.setattr(Registry, "call", call)
    monkeypatch.setenv("PREFT_API_KEY", "pft_test")
    return made


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (["--output", "json"], []),
        (["-o", "json"], []),
        (["--json"], []),
        ([], ["-o", "json"]),
        ([], ["--output=json"]),
        ([], ["--json"]),
    ],
)
def test_json_output_is_the_api_response(
    calls: list[Any], capsys: Any, before: list[str], after: list[str]
) -> None:
    """Before the command or after it, --output json and --json print the registry's body
    unchanged."""
    code, out, err = run_cli(
        capsys, *before, "fine-tune", "checkpoints", "ftjob-000000000000000000000002", *after
    )
    assert (code, err) == (0, "")
    assert json.loads(out) == CHECKPOINTS
    code, out, _ = run_cli(
        capsys, *before, "fine-tune", "get", "ftjob-000000000000000000000002", *after
    )
    assert code == 0 and json.loads(out) == JOB


def test_table_output_is_the_default(calls: list[Any], capsys: Any) -> None:
    code, out, _ = run_cli(
        capsys, "fine-tune", "checkpoints", "ftjob-000000000000000000000002", "--limit", "1"
    )
    assert code == 0
    assert calls[-1] == (
        "GET",
        "/v1/fine_tuning/jobs/ftjob-000000000000000000000002/checkpoints",
        {"params": {"limit": 1}},
    )
    header, row, more = out.splitlines()
    assert header.split() == ["ID", "STEP", "CHECKPOINT", "METRICS", "CREATED_AT"]
    assert row.split() == [
        "ftckpt-2",
        "16",
        "carol@2",
        "step=16",
        "train_loss=0.01235",
        "2026-01-01T00:00:00Z",
    ]
    assert more == "(more: --after ftckpt-2)"
    assert (
        run_cli(
            capsys, "-o", "table", "fine-tune", "checkpoints", "ftjob-000000000000000000000002"
        )[1]
        == out
    )
    code, out, _ = run_cli(capsys, "fine-tune", "get", "ftjob-000000000000000000000002")
    assert "status:      succeeded" in out and "fine_tuned:  carol" in out
    code, _, _ = run_cli(
        capsys, "fine-tune", "checkpoints", "ftjob-000000000000000000000002", "--after", "ftckpt-3"
    )
    assert calls[-1][2] == {"params": {"limit": 10, "after": "ftckpt-3"}}


def test_no_checkpoints_says_so(
    calls: list[Any], capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(CHECKPOINTS, "data", [])
    monkeypatch.setitem(CHECKPOINTS, "has_more", False)
    code, out, _ = run_cli(capsys, "fine-tune", "checkpoints", "ftjob-000000000000000000000002")
    assert (code, out) == (0, "no checkpoints (a job has one once it succeeds)\n")


def test_output_flags_conflict_or_are_unknown(calls: list[Any], capsys: Any) -> None:
    code, _, err = run_cli(capsys, "--json", "-o", "table", "fine-tune", "get", str(JOB["id"]))
    assert code == 2 and "--json and --output table contradict" in err
    code, _, err = run_cli(capsys, "-o", "yaml", "fine-tune", "get", str(JOB["id"]))
    assert code == 2 and "invalid choice: 'yaml'" in err
    assert calls == []


def _complete(tmp_path: Path, shell: str, *words: str) -> list[str]:
    """What bash offers for the last word of ``preft WORDS...`` (the script sourced, then
    its function called as bash's programmable completion calls it)."""
    path = tmp_path / f"preft.{shell}"
    path.write_text(script(build_parser(), shell))
    quoted = " ".join(f"'{w}'" for w in ("preft", *words))
    driver = (
        f"source {path}; COMP_WORDS=({quoted}); COMP_CWORD={len(words)}; _preft; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    result = subprocess.run(
        ["bash", "-c", driver], capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stderr == ""
    return [line for line in result.stdout.splitlines() if line]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completion(tmp_path: Path) -> None:
    top = _complete(tmp_path, "bash", "")
    assert {"adapter", "fine-tune", "tenant", "completion", "train"} <= set(top)
    assert _complete(tmp_path, "bash", "fine-tune", "ch") == ["checkpoints"]
    assert _complete(tmp_path, "bash", "--output", "") == ["table", "json"]
    # Options and their values before the command path are skipped.
    assert _complete(
        tmp_path,
        "bash",
        "--url",
        "http://x",
        "-o",
        "json",
        "adapter",
        "upload",
        "dir",
        "--mode",
        "",
    ) == ["prefill", "all"]
    assert "--output" in _complete(tmp_path, "bash", "adapter", "list", "--o")
    assert set(_complete(tmp_path, "bash", "fine-tune", "checkpoints", "-")) >= {
        "--limit",
        "--after",
        "--output",
        "--json",
        "--api-key",
    }
    assert _complete(tmp_path, "bash", "completion", "") == ["bash", "zsh"]
    assert _complete(tmp_path, "bash", "fine-tune", "create", "--type", "d") == ["direft"]
    # A free value or a positional: nothing from us, so bash completes file names.
    assert _complete(tmp_path, "bash", "fine-tune", "create", "") == []
    assert _complete(tmp_path, "bash", "--url", "") == []


_ZSH_DRIVER = """
autoload -U compinit && compinit -u
source {script}
print -r -- "registered: ${{_comps[preft]}}"
local -a words COMP_WORDS
local CURRENT COMP_CWORD
words=( preft {words} ); COMP_WORDS=( "${{words[@]}}" ); CURRENT=${{#words}}
COMP_CWORD=$(( CURRENT - 1 ))
compgen -F _preft -- "${{words[-1]}}"
"""


@pytest.mark.skipif(shutil.which("zsh") is None, reason="needs zsh")
@pytest.mark.parametrize(
    ("words", "offered"),
    [
        (["''"], {"adapter", "fine-tune", "completion"}),
        (
            ["--url", "http://x", "-o", "json", "adapter", "upload", "dir", "--mode", "''"],
            {"prefill", "all"},
        ),
        (["completion", "''"], {"bash", "zsh"}),
        (["fine-tune", "checkpoints", "-"], {"--limit", "--after", "--output"}),
        (["fine-tune", "create", "''"], set()),
    ],
)
def test_zsh_completion(tmp_path: Path, words: list[str], offered: set[str]) -> None:
    """zsh's bashcompinit calls the functions as ``_bash_complete`` does (in sh emulation,
    0-based arrays); zsh itself then matches the candidates against the typed prefix."""
    path = tmp_path / "preft.zsh"
    path.write_text(script(build_parser(), "zsh"))
    driver = _ZSH_DRIVER.format(script=path, words=" ".join(words))
    result = subprocess.run(
        ["zsh", "-f", "-c", driver],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=tmp_path,
    )
    first, *lines = result.stdout.splitlines()
    assert first == "registered: _bash_complete -o default -F _preft", result.stderr
    candidates = {line for line in lines if line}
    assert offered <= candidates and (offered or not candidates), candidates


def test_zsh_script_runs_the_bash_functions_through_bashcompinit(
    tmp_path: Path, capsys: Any
) -> None:
    zsh = script(build_parser(), "zsh")
    head, _, rest = zsh.partition("\n\n")
    assert "zsh completion for preft" in head
    assert rest.startswith("autoload -U +X bashcompinit && bashcompinit\n")
    assert rest.split("\n\n", 1)[1] == script(build_parser(), "bash").split("\n\n", 1)[1]
    assert run_cli(capsys, "completion", "zsh") == (0, zsh, "")
    syntax = subprocess.run(
        ["bash", "-n"], input=zsh, capture_output=True, text=True, timeout=30, check=False
    )
    assert syntax.returncode == 0, syntax.stderr
    with pytest.raises(ValueError, match="choose one of bash, zsh"):
        script(build_parser(), "fish")
