"""The CLI's config file without a registry: where it lives, how it is written, and the
error a broken one gives; and the context commands that only read or edit it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from preft_serve.cli import config
from preft_serve.cli.client import CliError
from tests.support.cli import run_cli

KEY_A = "pft_ka1b2c3d4.secretsecretAAAA"
KEY_B = "pft_kb1b2c3d4.secretsecretBBBB"


def _write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    path.chmod(0o600)
    return path


def _two_contexts(config_home: Path) -> Path:
    return _write(
        config_home / "preft" / "config.yaml",
        {
            "current-context": "a",
            "contexts": {
                "a": {"url": "http://a.example:8081", "api_key": KEY_A},
                "b": {"url": "https://b.example", "api_key": KEY_B},
            },
        },
    )


def test_location_follows_preft_config_then_xdg(
    config_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert config.config_path() == config_home / "preft" / "config.yaml"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config.config_path() == tmp_path / "home" / ".config" / "preft" / "config.yaml"
    monkeypatch.setenv("PREFT_CONFIG", str(tmp_path / "elsewhere.yaml"))
    assert config.config_path() == tmp_path / "elsewhere.yaml"


def test_save_writes_0600_in_a_new_0700_directory_atomically(config_home: Path) -> None:
    cfg = config.Config(
        contexts={"a": config.Context(url="http://a.example/", api_key=KEY_A)}, current_context="a"
    )
    path = config.save(cfg)
    assert path == config_home / "preft" / "config.yaml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert yaml.safe_load(path.read_text()) == {
        "current-context": "a",
        "contexts": {"a": {"url": "http://a.example", "api_key": KEY_A}},
    }
    inode = path.stat().st_ino
    config.save(config.Config())
    assert path.stat().st_ino != inode  # replaced by rename, not rewritten in place
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.yaml"]
    assert config.load() == config.Config()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    config_home: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _two_contexts(config_home)
    before = path.read_bytes()

    def full_disk(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    code, _, err = run_cli(capsys, "context", "use", "b")
    assert code == 1
    assert err == (
        f"error: cannot write config file {path} (No space left on device); nothing "
        "was changed: check that directory's permissions and free space, or set "
        "PREFT_CONFIG to another path\n"
    )
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.yaml"]


def test_an_unwritable_directory_is_a_clear_error(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("PREFT_CONFIG", str(blocker / "config.yaml"))  # a file as its directory
    code, _, err = run_cli(capsys, "context", "list")
    assert (code, err) == (
        1,
        f"error: config file {blocker}/config.yaml cannot be read (Not a "
        "directory); fix it, or delete it and run `preft login` again\n",
    )
    with pytest.raises(CliError, match=f"cannot write config file {blocker}/config.yaml"):
        config.save(config.Config())


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("contexts: [\n", "is not valid YAML at line 2, column 1"),
        ("- a\n- b\n", "must be a YAML mapping with 'contexts' and 'current-context'"),
        ({"contexts": {"a": {"url": "http://a.example"}}}, "contexts.a.api_key: Field required"),
        (
            {"contexts": {"a": {"url": "ftp://a", "api_key": KEY_A}}},
            "contexts.a.url: URL 'ftp://a' must be http:// or https:// with a host",
        ),
        (
            {"contexts": {}, "current-context": "gone"},
            "current-context 'gone' is not one of the contexts (none)",
        ),
        ({"contexts": {}, "token": "x"}, "token: Extra inputs are not permitted"),
        (
            {"contexts": {"bad name": {"url": "http://a.example", "api_key": KEY_A}}},
            "context name 'bad name' must be 1-64 letters",
        ),
        (
            {"contexts": {"a": {"url": "http://a.example", "api_key": "has space"}}},
            "an API key is 1-512 printable characters without spaces",
        ),
        ("x: " + "y" * config.MAX_CONFIG_BYTES, f"is larger than {config.MAX_CONFIG_BYTES} bytes"),
        (b"\xff\xfe", "is not UTF-8 text"),
    ],
)
def test_a_broken_file_names_itself_and_the_fix(
    config_home: Path, capsys: Any, content: Any, problem: str
) -> None:
    path = config_home / "preft" / "config.yaml"
    if isinstance(content, bytes):
        path.parent.mkdir(parents=True)
        path.write_bytes(content)
        path.chmod(0o600)
    else:
        _write(path, content)
    before = path.read_bytes()
    for argv in (["context", "list"], ["context", "use", "a"], ["adapter", "list"]):
        code, out, err = run_cli(capsys, *argv)
        assert (code, out) == (1, ""), argv
        assert err.startswith(f"error: config file {path} ")
        assert problem in err
        assert err.endswith("; fix it, or delete it and run `preft login` again\n")
        assert "Traceback" not in err
    code, out, _ = run_cli(capsys, "--json", "context", "list")
    assert code == 1 and json.loads(out)["error"]["code"] == "config"
    assert path.read_bytes() == before


def test_a_readable_file_is_warned_about(config_home: Path, capsys: Any) -> None:
    path = _two_contexts(config_home)
    path.chmod(0o644)
    code, _, err = run_cli(capsys, "context", "current")
    assert code == 0
    assert err == (
        f"warning: config file {path} holds API keys and others can read it; run chmod 600 {path}\n"
    )


def test_context_list_masks_keys(config_home: Path, capsys: Any) -> None:
    _two_contexts(config_home)
    code, out, err = run_cli(capsys, "context", "list")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "CURRENT  NAME  URL                    API_KEY",
        "*        a     http://a.example:8081  pft_…AAAA",
        "         b     https://b.example      pft_…BBBB",
    ]
    code, out, _ = run_cli(capsys, "context", "list", "--output", "json")
    assert code == 0
    assert json.loads(out) == {
        "current_context": "a",
        "contexts": [
            {"current": True, "name": "a", "url": "http://a.example:8081", "api_key": "pft_…AAAA"},
            {"current": False, "name": "b", "url": "https://b.example", "api_key": "pft_…BBBB"},
        ],
    }
    for argv in (
        ["context", "list"],
        ["--json", "context", "list"],
        ["context", "current"],
        ["--json", "context", "current"],
    ):
        out = run_cli(capsys, *argv)[1]
        assert "secret" not in out and KEY_A[-8:] not in out
    assert config.masked("short_key") == "short_…"


def test_use_current_delete_and_logout(config_home: Path, capsys: Any) -> None:
    path = _two_contexts(config_home)
    assert run_cli(capsys, "context", "current") == (0, "a\n", "")
    code, _, err = run_cli(capsys, "context", "use", "prod")
    assert code == 1
    assert err == (
        f"error: no context named 'prod' in {path} (known: a, b); add one with "
        "`preft login --url URL --context NAME`\n"
    )
    assert run_cli(capsys, "context", "use", "b") == (
        0,
        "current context: b (https://b.example)\n",
        "",
    )
    assert yaml.safe_load(path.read_text())["current-context"] == "b"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    code, out, _ = run_cli(capsys, "context", "delete", "a")
    assert code == 0 and out == f"deleted context 'a' and its key from {path}\n"
    assert yaml.safe_load(path.read_text()) == {
        "current-context": "b",
        "contexts": {"b": {"url": "https://b.example", "api_key": KEY_B}},
    }
    assert run_cli(capsys, "logout")[0] == 0  # the current one: b
    assert yaml.safe_load(path.read_text()) == {"contexts": {}}
    code, _, err = run_cli(capsys, "logout")
    assert code == 1 and "no current context to log out of" in err
    code, _, err = run_cli(capsys, "context", "current")
    assert code == 1 and "no current context in" in err


def test_an_unknown_context_flag_lists_the_known_ones(config_home: Path, capsys: Any) -> None:
    path = _two_contexts(config_home)
    code, out, err = run_cli(capsys, "--context", "prod", "adapter", "list")
    assert (code, out) == (1, "")
    assert err == (
        f"error: no context named 'prod' in {path} (known: a, b); add one with "
        "`preft login --url URL --context NAME`\n"
    )


def test_login_never_takes_a_key_from_the_command_line(config_home: Path, capsys: Any) -> None:
    code, _, err = run_cli(capsys, "--api-key", KEY_A, "login", "--url", "http://a.example")
    assert code == 1 and "never the command line" in err
    code, _, err = run_cli(capsys, "login", "--url", "http://a.example", "--api-key", KEY_A)
    assert code == 2 and "unrecognized arguments: --api-key ***" in err
    assert KEY_A not in err  # argparse's echo of what it did not understand is masked
    code, _, err = run_cli(capsys, "login", "--url", "http://a.example", f"--api-key={KEY_A}")
    assert code == 2 and "unrecognized arguments: --api-key=***" in err and KEY_A not in err
    assert not (config_home / "preft").exists()
