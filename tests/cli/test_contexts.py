"""``preft login`` and named contexts against a live registry: the key is checked before it
is saved, never read from argv nor printed, and flags, environment and contexts take
precedence in the documented order."""

from __future__ import annotations

import io
import json
import os
import select
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from preft_serve.cli.config import masked
from tests.support.cli import run_cli
from tests.support.registry_api import ADMIN_TOKEN


def _tenant(url: str, name: str, capsys: Any) -> str:
    code, out, err = run_cli(
        capsys, "tenant", "create", name, "--url", url, "--admin-token", ADMIN_TOKEN, "--json"
    )
    assert code == 0, err
    return str(json.loads(out)["api_key"])


def _login(
    capsys: Any, monkeypatch: pytest.MonkeyPatch, key: str, *argv: str
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(key + "\n"))
    return run_cli(capsys, "login", *argv)


def _tenant_used(capsys: Any, *argv: str) -> str:
    """The tenant whose key a command sent (the usage report names it)."""
    code, out, err = run_cli(capsys, *argv, "--json", "usage")
    assert code == 0, err
    return str(json.loads(out)["tenant"])


@pytest.fixture
def cfg_path(config_home: Path) -> Path:
    return config_home / "preft" / "config.yaml"


def test_login_checks_the_key_then_saves_it_private(
    live_server: str, capsys: Any, monkeypatch: pytest.MonkeyPatch, cfg_path: Path
) -> None:
    key = _tenant(live_server, "acme", capsys)
    code, out, err = _login(
        capsys, monkeypatch, key, "--url", live_server + "/", "--context", "prod"
    )
    assert (code, err) == (0, "")
    assert out == (
        f"logged in to {live_server} as context 'prod' (key {masked(key)}), now "
        f"current; saved in {cfg_path}\n"
    )
    assert key not in out
    assert stat.S_IMODE(cfg_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(cfg_path.parent.stat().st_mode) == 0o700
    assert yaml.safe_load(cfg_path.read_text()) == {
        "current-context": "prod",
        "contexts": {"prod": {"url": live_server, "api_key": key}},
    }
    # No flag, no environment: the current context's URL and key.
    code, out, err = run_cli(capsys, "adapter", "list")
    assert (code, err) == (0, "") and out.split() == [
        "NAME",
        "VERSION",
        "TYPE",
        "MODE",
        "RANK",
        "BOUND_USERS",
        "SHA256",
    ]
    assert _tenant_used(capsys) == "acme"
    for argv in (["context", "list"], ["--json", "context", "list"], ["context", "current"]):
        code, out, _ = run_cli(capsys, *argv)
        assert code == 0 and key not in out and key[-8:] not in out
    code, out, _ = run_cli(capsys, "context", "list", "-o", "json")
    assert json.loads(out)["contexts"] == [
        {"current": True, "name": "prod", "url": live_server, "api_key": masked(key)}
    ]
    key2 = json.loads(
        run_cli(
            capsys,
            "tenant",
            "new-key",
            "acme",
            "--url",
            live_server,
            "--admin-token",
            ADMIN_TOKEN,
            "--json",
        )[1]
    )["api_key"]
    code, out, _ = _login(capsys, monkeypatch, key2, "--url", live_server, "--context", "prod")
    assert code == 0 and f"(key {masked(key2)}, replacing its previous key {masked(key)})" in out
    assert yaml.safe_load(cfg_path.read_text())["contexts"]["prod"]["api_key"] == key2


def test_a_rejected_key_is_not_saved(
    live_server: str, capsys: Any, monkeypatch: pytest.MonkeyPatch, cfg_path: Path
) -> None:
    key = _tenant(live_server, "acme", capsys)
    assert _login(capsys, monkeypatch, key, "--url", live_server, "--context", "prod")[0] == 0
    before, mtime = cfg_path.read_bytes(), cfg_path.stat().st_mtime_ns
    admin = ["--url", live_server, "--admin-token", ADMIN_TOKEN]
    shown = json.loads(run_cli(capsys, "tenant", "show", "acme", *admin, "--json")[1])
    code, _, err = run_cli(
        capsys, "tenant", "revoke-key", "acme", shown["keys"][0]["key_id"], *admin
    )
    assert code == 0, err
    for bad in (key, "pft_nosuch.key"):
        code, out, err = _login(
            capsys, monkeypatch, bad, "--url", live_server, "--context", "other"
        )
        assert (code, out) == (1, "")
        assert err == (
            f"error: the registry at {live_server} rejected this key (invalid or "
            "revoked API key); nothing was saved: check the key, or issue a new one "
            "with `preft tenant new-key TENANT` (HTTP 401)\n"
        )
    code, out, _ = _login(capsys, monkeypatch, "pft_nosuch.key", "--json", "--url", live_server)
    assert code == 1 and json.loads(out)["error"]["code"] == "key_rejected"
    code, _, err = _login(capsys, monkeypatch, "pft_x.y", "--url", "http://127.0.0.1:9")
    assert code == 1 and err.startswith(
        "error: could not check the key against "
        "http://127.0.0.1:9, so nothing was saved: cannot reach"
    )
    assert (cfg_path.read_bytes(), cfg_path.stat().st_mtime_ns) == (before, mtime)
    assert sorted(p.name for p in cfg_path.parent.iterdir()) == ["config.yaml"]


def test_an_inference_key_is_saved_though_it_cannot_read_adapters(
    live_server: str, capsys: Any, monkeypatch: pytest.MonkeyPatch, cfg_path: Path
) -> None:
    """The check's GET is refused for the key's role (403), not for the key: it is saved,
    and a command past its role says so."""
    admin_key = _tenant(live_server, "acme", capsys)
    code, out, err = run_cli(
        capsys,
        "--json",
        "key",
        "create",
        "--role",
        "inference",
        "--url",
        live_server,
        "--api-key",
        admin_key,
    )
    assert code == 0, err
    key = json.loads(out)["api_key"]
    code, out, err = _login(capsys, monkeypatch, key, "--url", live_server, "--context", "chat")
    assert code == 0, err
    assert out.startswith(f"logged in to {live_server} as context 'chat' (key {masked(key)})")
    assert yaml.safe_load(cfg_path.read_text())["contexts"]["chat"]["api_key"] == key
    code, out, err = run_cli(capsys, "adapter", "list")
    assert code == 1 and "(HTTP 403)" in err and "inference" in err, err


def test_precedence_flag_context_flag_env_current(
    live_server: str, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = {
        name: _tenant(live_server, name, capsys) for name in ("current", "named", "env", "flag")
    }
    assert (
        _login(capsys, monkeypatch, keys["named"], "--url", live_server, "--context", "named")[0]
        == 0
    )
    assert (
        _login(capsys, monkeypatch, keys["current"], "--url", live_server, "--context", "current")[
            0
        ]
        == 0
    )
    assert _tenant_used(capsys) == "current"
    monkeypatch.setenv("PREFT_API_KEY", keys["env"])
    assert _tenant_used(capsys) == "env"  # environment over the current context
    assert _tenant_used(capsys, "--context", "named") == "named"  # a flag over environment
    assert _tenant_used(capsys, "--api-key", keys["flag"]) == "flag"
    assert _tenant_used(capsys, "--context", "named", "--api-key", keys["flag"]) == "flag"
    # The URL: a flag over the environment over the context.
    monkeypatch.setenv("PREFT_REGISTRY_URL", "http://127.0.0.1:9")
    code, _, err = run_cli(capsys, "adapter", "list")
    assert code == 1 and "cannot reach the registry at http://127.0.0.1:9" in err
    assert _tenant_used(capsys, "--url", live_server) == "env"
    assert _tenant_used(capsys, "--context", "named") == "named"  # its URL too
    monkeypatch.delenv("PREFT_REGISTRY_URL")
    monkeypatch.delenv("PREFT_API_KEY")


def test_a_context_key_goes_only_to_its_own_url(
    live_server: str, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``localhost`` and ``127.0.0.1`` reach the same server, but are not the URL the key
    was saved for, so the CLI does not send it."""
    key = _tenant(live_server, "acme", capsys)
    assert _login(capsys, monkeypatch, key, "--url", live_server, "--context", "prod")[0] == 0
    other = live_server.replace("127.0.0.1", "localhost")
    for argv in (["--url", other], ["--context", "prod", "--url", other]):
        code, out, err = run_cli(capsys, *argv, "adapter", "list")
        assert (code, out) == (2, "")
        assert (
            f"error: no API key for {other}: context 'prod' holds a key for {live_server} only"
        ) in err
    monkeypatch.setenv("PREFT_REGISTRY_URL", other)
    assert run_cli(capsys, "adapter", "list")[0] == 2
    assert _tenant_used(capsys, "--url", other, "--api-key", key) == "acme"


def test_environment_alone_ignores_a_broken_config(
    live_server: str, capsys: Any, monkeypatch: pytest.MonkeyPatch, cfg_path: Path
) -> None:
    key = _tenant(live_server, "acme", capsys)
    cfg_path.parent.mkdir(parents=True)
    cfg_path.write_text("contexts: [\n")
    cfg_path.chmod(0o600)
    monkeypatch.setenv("PREFT_REGISTRY_URL", live_server)
    monkeypatch.setenv("PREFT_API_KEY", key)
    assert _tenant_used(capsys) == "acme"
    monkeypatch.delenv("PREFT_API_KEY")
    code, _, err = run_cli(capsys, "adapter", "list")
    assert code == 1 and err.startswith(f"error: config file {cfg_path} is not valid YAML")
    code, _, err = _login(capsys, monkeypatch, key, "--url", live_server)
    assert code == 1 and err.startswith(f"error: config file {cfg_path} is not valid YAML")
    assert cfg_path.read_text() == "contexts: [\n"


def _read_until(fd: int, marker: bytes, timeout: float = 60) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"no {marker!r} in {seen!r}")
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        seen += chunk
    return seen


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs util-linux setsid")
def test_login_on_a_terminal_prompts_without_echo(
    live_server: str, capsys: Any, config_home: Path, cfg_path: Path
) -> None:
    """The console script on a real pseudo-terminal (its controlling terminal, as getpass
    needs): the prompt appears, the typed key is not echoed, and the saved key works."""
    key = _tenant(live_server, "acme", capsys)
    preft = Path(sys.executable).with_name("preft")
    controller, terminal = os.openpty()
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home)}
    proc = subprocess.Popen(
        ["setsid", "-c", str(preft), "login", "--url", live_server],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=env,
    )
    os.close(terminal)
    try:
        shown = _read_until(controller, f"API key for {live_server}: ".encode())
        os.write(controller, key.encode() + b"\n")
        shown += _read_until(controller, b"saved in")
        assert proc.wait(60) == 0, shown
        shown += _read_until(controller, b"\n", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(controller)
    assert key.encode() not in shown
    assert key not in " ".join(proc.args)
    name = live_server.split("//", 1)[1]
    assert yaml.safe_load(cfg_path.read_text()) == {
        "current-context": name,
        "contexts": {name: {"url": live_server, "api_key": key}},
    }
    assert _tenant_used(capsys) == "acme"
