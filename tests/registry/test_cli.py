"""The ``preft`` CLI against a live registry over HTTP."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

import pytest

from preft_serve.cli import tenant as cli_tenant
from tests.support.cli import config_home, run_cli  # noqa: F401  (autouse fixture)
from tests.support.registry_api import ADMIN_TOKEN


@pytest.fixture
def tenant_key(live_server, capsys) -> str:
    code, out, _ = run_cli(
        capsys,
        "tenant",
        "create",
        "acme",
        "--url",
        live_server,
        "--admin-token",
        ADMIN_TOKEN,
        "--json",
    )
    assert code == 0
    return json.loads(out)["api_key"]


def test_tenant_adapter_user_workflow(
    live_server, tenant_key, lora_dir, lora_dir2, capsys, monkeypatch, tmp_path
):
    monkeypatch.setenv("PREFT_REGISTRY_URL", live_server)
    monkeypatch.setenv("PREFT_API_KEY", tenant_key)
    code, out, err = run_cli(
        capsys,
        "adapter",
        "upload",
        str(lora_dir),
        "--name",
        "bot",
        "--mode",
        "prefill",
        "--progress",
    )
    assert code == 0, err
    assert "version:     1" in out and "type:        lora" in out
    assert "uploading bot: 100%" in err and "/s]" in err  # tqdm: bytes, rate and ETA
    archive = tmp_path / "v2.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(lora_dir2, arcname="v2")
    code, out, err = run_cli(
        capsys, "adapter", "upload", str(archive), "--name", "bot", "--new-version", "--promote",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["version"] == 2 and json.loads(out)["mode"] == "prefill"
    assert json.loads(out)["state"] == "serving"  # --promote: the hot swap
    code, out, _ = run_cli(capsys, "adapter", "list")
    assert code == 0
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "VERSION", "TYPE", "MODE", "RANK", "BOUND_USERS", "SHA256"]
    assert row.split()[:6] == ["bot", "2", "lora", "prefill", "8", "0"]
    assert run_cli(capsys, "user", "bind", "alice", "bot")[0] == 0
    code, out, _ = run_cli(capsys, "user", "show", "alice", "--json")
    assert json.loads(out)["adapter"] == "bot"
    code, out, _ = run_cli(capsys, "adapter", "show", "bot")
    assert "bound_users: 1" in out and "versions:" in out
    code, _, err = run_cli(capsys, "adapter", "delete", "bot")
    assert code == 1
    assert err == (
        "error: adapter 'bot' is bound to 1 user(s); unbind them first or delete "
        "with --force, which also unbinds them (HTTP 409)\n"
    )
    assert run_cli(capsys, "user", "unbind", "alice") == (0, "ok\n", "")
    assert run_cli(capsys, "adapter", "delete", "bot") == (0, "ok\n", "")


def test_clear_errors(live_server, tenant_key, lora_dir, tmp_path, capsys):
    common = ["--url", live_server, "--api-key", tenant_key]
    code, _, err = run_cli(capsys, "adapter", "show", "ghost", *common)
    assert (code, err) == (1, "error: adapter 'ghost' does not exist (HTTP 404)\n")
    code, _, err = run_cli(capsys, "adapter", "list", "--url", live_server, "--api-key", "pft_x.y")
    assert (code, err) == (1, "error: invalid or revoked API key (HTTP 401)\n")
    (tmp_path / "adapter_model.bin").write_bytes(b"\x80\x04")
    code, _, err = run_cli(
        capsys, "adapter", "upload", str(tmp_path), "--name", "x", "--mode", "all", *common
    )
    assert code == 1
    assert (
        "lacks adapter_config.json and adapter_model.safetensors; found adapter_model.bin: "
        "convert it to safetensors" in err
    )
    code, _, err = run_cli(capsys, "adapter", "upload", str(lora_dir), "--name", "x", *common)
    assert (code, err) == (1, "error: --mode is required for a new adapter (prefill or all)\n")
    code, _, err = run_cli(
        capsys, "adapter", "list", "--url", "http://127.0.0.1:9", "--api-key", tenant_key
    )
    assert code == 1
    assert err.startswith("error: cannot reach the registry at http://127.0.0.1:9")
    code, _, err = run_cli(capsys, "adapter", "list", "--url", live_server)
    assert code == 2 and "no API key: pass --api-key or set PREFT_API_KEY" in err


def test_console_script_help():
    proc = subprocess.run(
        [sys.executable, "-m", "preft_serve.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0
    assert "preft adapter upload ./my-adapter --name support-bot --mode prefill" in proc.stdout


def test_tenant_limits(live_server, tenant_key, capsys):
    common = ("--url", live_server, "--admin-token", ADMIN_TOKEN, "--json")
    code, out, _ = run_cli(
        capsys,
        "tenant",
        "limits",
        "acme",
        "--rps",
        "20",
        "--user-rps",
        "2",
        "--user-tpm",
        "600",
        *common,
    )
    assert code == 0 and json.loads(out)["tenant_rps"] == 20.0
    code, out, _ = run_cli(capsys, "tenant", "limits", "acme", *common)
    assert json.loads(out) == {
        "tenant_rps": 20.0,
        "tenant_burst": None,
        "user_rps": 2.0,
        "user_burst": None,
        "tenant_tpm": None,
        "user_tpm": 600.0,
    }
    code, out, _ = run_cli(capsys, "tenant", "limits", "acme", "--clear", *common)
    assert code == 0 and json.loads(out)["tenant_rps"] is None
    code, out, _ = run_cli(capsys, "tenant", "limits", "acme", "--rps", "-3", *common)
    assert code == 1 and "greater than or equal to 0" in json.loads(out)["error"]["message"]


def test_upload_warnings_and_strict(live_server, tenant_key, lora_dir, tmp_path, capsys):
    from tests.registry import factories

    other = factories.edit_config(
        factories.copy_adapter(lora_dir, tmp_path / "a"),
        base_model_name_or_path="meta-llama/Llama-3.1-8B",
    )
    common = ["--url", live_server, "--api-key", tenant_key, "--mode", "prefill"]
    code, _, err = run_cli(
        capsys, "adapter", "upload", str(other), "--name", "bot", "--strict", *common
    )
    assert code == 1
    assert err.startswith(
        "error: strict mode: adapter_config.json names "
        "base_model_name_or_path 'meta-llama/Llama-3.1-8B'"
    )
    code, out, err = run_cli(capsys, "adapter", "upload", str(other), "--name", "bot", *common)
    assert code == 0
    assert err.startswith("warning: adapter_config.json names base_model_name_or_path")
    assert "version:     1" in out and "warnings" not in out


def test_version(capsys):
    assert run_cli(capsys, "--version") == (0, f"preft {metadata.version('preft-serve')}\n", "")


def test_json_errors_on_stdout(live_server, tenant_key, lora_dir, capsys):
    common = ["--url", live_server, "--api-key", tenant_key, "--json"]
    code, out, err = run_cli(capsys, "adapter", "show", "ghost", *common)
    assert code == 1 and err == ""
    assert json.loads(out) == {
        "error": {
            "message": "adapter 'ghost' does not exist",
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found",
            "http_status": 404,
        }
    }
    code, out, _ = run_cli(capsys, "adapter", "upload", str(lora_dir), "--name", "x", *common)
    assert code == 1
    assert (
        json.loads(out)["error"]["message"] == "--mode is required for a new adapter "
        "(prefill or all)"
    )
    code, out, _ = run_cli(
        capsys, "adapter", "list", "--url", "http://127.0.0.1:9", "--api-key", tenant_key, "--json"
    )
    assert code == 1 and json.loads(out)["error"]["code"] == "unreachable"
    # --progress draws on stderr only: stdout stays one JSON document.
    code, out, err = run_cli(
        capsys,
        "adapter",
        "upload",
        str(lora_dir),
        "--name",
        "bot",
        "--mode",
        "prefill",
        "--progress",
        *common,
    )
    assert code == 0 and json.loads(out)["version"] == 1 and "uploading bot: 100%" in err


def test_messages_name_cli_flags(live_server, tenant_key, lora_dir, lora_dir2, capsys):
    common = ["--url", live_server, "--api-key", tenant_key]
    assert (
        run_cli(
            capsys,
            "adapter",
            "upload",
            str(lora_dir),
            "--name",
            "bot",
            "--mode",
            "prefill",
            *common,
        )[0]
        == 0
    )
    code, _, err = run_cli(
        capsys, "adapter", "upload", str(lora_dir2), "--name", "bot", "--mode", "prefill", *common
    )
    assert code == 1 and "--new-version" in err and "/v1/" not in err
    code, _, err = run_cli(
        capsys, "tenant", "create", "acme", "--url", live_server, "--admin-token", ADMIN_TOKEN
    )
    assert code == 1 and "`preft tenant new-key acme`" in err and "/v1/" not in err


def _sha(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_download_rollback_and_user_list(
    live_server, tenant_key, lora_dir, lora_dir2, capsys, monkeypatch, tmp_path
):
    monkeypatch.setenv("PREFT_REGISTRY_URL", live_server)
    monkeypatch.setenv("PREFT_API_KEY", tenant_key)
    code, out, _ = run_cli(
        capsys, "adapter", "upload", str(lora_dir), "--name", "bot", "--mode", "prefill", "--json"
    )
    v1 = json.loads(out)["sha256"]
    code, out, _ = run_cli(
        capsys, "adapter", "upload", str(lora_dir2), "--name", "bot", "--new-version", "--promote",
        "--json",
    )  # fmt: skip
    v2 = json.loads(out)["sha256"]
    assert code == 0 and v1 != v2
    # Download v1 and upload the folder back unchanged: the same content (sha256).
    code, out, err = run_cli(
        capsys,
        "adapter",
        "download",
        "bot",
        "--version",
        "1",
        "--out",
        str(tmp_path / "dl"),
        "--json",
    )
    assert code == 0, out
    assert json.loads(out) == {
        "name": "bot",
        "version": 1,
        "sha256": v1,
        "path": str(tmp_path / "dl"),
    }
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    code, out, _ = run_cli(
        capsys,
        "adapter",
        "upload",
        str(tmp_path / "dl"),
        "--name",
        "copy",
        "--mode",
        "prefill",
        "--json",
    )
    assert code == 0 and json.loads(out)["sha256"] == v1
    code, _, err = run_cli(capsys, "adapter", "download", "bot", "--out", str(tmp_path / "dl"))
    assert code == 1 and "--force" in err
    code, out, _ = run_cli(
        capsys, "adapter", "download", "bot", "--out", str(tmp_path / "dl"), "--force", "--json"
    )
    assert json.loads(out)["sha256"] == v2 and json.loads(out)["version"] == 2
    before = _sha(tmp_path / "dl")
    assert (
        run_cli(
            capsys,
            "adapter",
            "upload",
            str(tmp_path / "dl"),
            "--name",
            "bot",
            "--new-version",
            "--json",
        )[1].count('"version": 2')
        == 1
    )  # identical: no-op
    assert _sha(tmp_path / "dl") == before
    code, _, err = run_cli(
        capsys, "adapter", "download", "bot", "--version", "9", "--out", str(tmp_path / "x")
    )
    assert code == 1
    assert err == "error: adapter 'bot' has no version 9; its versions are 1 to 2 (HTTP 404)\n"
    # Rollback: version 1's content becomes current as version 3.
    code, out, _ = run_cli(capsys, "adapter", "rollback", "bot", "1", "--json")
    assert code == 0 and json.loads(out)["version"] == 3 and json.loads(out)["sha256"] == v1
    code, out, _ = run_cli(capsys, "adapter", "rollback", "bot", "1", "--json")
    assert code == 0 and json.loads(out)["version"] == 3  # already current: unchanged
    # user list, all and per adapter.
    for user, name in (("bob", "bot"), ("alice", "bot"), ("carol", "copy")):
        assert run_cli(capsys, "user", "bind", user, name)[0] == 0
    code, out, _ = run_cli(capsys, "user", "list")
    assert out.splitlines() == ["USER   ADAPTER", "alice  bot", "bob    bot", "carol  copy"]
    code, out, _ = run_cli(capsys, "user", "list", "--adapter", "copy", "--json")
    assert json.loads(out) == {"items": [{"user": "carol", "adapter": "copy"}], "next_cursor": None}
    # A page at a time: the cursor to go on with, then the rest.
    code, out, _ = run_cli(capsys, "user", "list", "--limit", "2")
    assert out.splitlines() == [
        "USER   ADAPTER",
        "alice  bot",
        "bob    bot",
        "(more: --cursor bob, or --all)",
    ]
    code, out, _ = run_cli(capsys, "user", "list", "--limit", "2", "--cursor", "bob", "--json")
    assert json.loads(out) == {"items": [{"user": "carol", "adapter": "copy"}], "next_cursor": None}
    code, out, _ = run_cli(capsys, "user", "list", "--limit", "1", "--all", "--json")
    assert [b["user"] for b in json.loads(out)["items"]] == ["alice", "bob", "carol"]


def test_tenant_list_and_delete(live_server, tenant_key, capsys, monkeypatch):
    common = ("--url", live_server, "--admin-token", ADMIN_TOKEN)
    assert run_cli(capsys, "tenant", "create", "globex", *common)[0] == 0
    assert run_cli(capsys, "tenant", "create", "initech", *common)[0] == 0
    listed = [["NAME", "ADAPTERS"], ["acme", "0"], ["globex", "0"], ["initech", "0"]]
    code, out, _ = run_cli(capsys, "tenant", "list", *common)
    assert [line.split()[:2] for line in out.splitlines()] == listed
    # A page per tenant: the CLI follows the registry's next links to the end.
    monkeypatch.setattr(cli_tenant, "TENANT_PAGE", 1)
    code, out, _ = run_cli(capsys, "tenant", "list", *common)
    assert [line.split()[:2] for line in out.splitlines()] == listed
    monkeypatch.undo()
    assert run_cli(capsys, "tenant", "delete", "initech", "--yes", *common)[0] == 0
    code, _, err = run_cli(capsys, "tenant", "delete", "globex", *common)
    assert code == 1 and "pass --yes" in err
    code, out, _ = run_cli(capsys, "tenant", "delete", "globex", "--yes", *common, "--json")
    assert code == 0
    assert json.loads(out) == {
        "name": "globex",
        "keys": 1,
        "adapters": 0,
        "bindings": 0,
        "blobs": 0,
        "files": 0,
        "fine_tuning_jobs": 0,
    }
    code, out, _ = run_cli(capsys, "tenant", "list", *common, "--json")
    assert [t["name"] for t in json.loads(out)] == ["acme"]


def test_usage(live_server, tenant_key, capsys, redis_client, namespace):
    from preft_serve.common.registry_client import RegistryKeys

    redis_client.hset(
        RegistryKeys(namespace).usage("acme", "20260310"),
        mapping={"bot:requests": 2, "bot:prompt_tokens": 10, "bot:completion_tokens": 6},
    )
    common = ("--url", live_server, "--api-key", tenant_key)
    code, out, _ = run_cli(capsys, "usage", "--start", "2026-03-09", "--end", "2026-03-10", *common)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split() == ["DATE", "MODEL", "REQUESTS", "PROMPT_TOKENS", "COMPLETION_TOKENS"]
    assert lines[1].split() == ["2026-03-10", "bot", "2", "10", "6"]
    assert lines[2].split() == ["total", "2", "10", "6"]
    code, out, _ = run_cli(
        capsys, "usage", "--start", "2026-03-09", "--end", "2026-03-10", "--json", *common
    )
    assert code == 0 and json.loads(out)["days"][0]["models"][0]["requests"] == 2
    code, out, _ = run_cli(
        capsys, "usage", "--start", "2026-01-01", "--end", "2026-12-31", "--json", *common
    )
    assert code == 1 and "at most 92" in json.loads(out)["error"]["message"]


def test_tenant_quotas(live_server, tenant_key, capsys):
    common = ("--url", live_server, "--admin-token", ADMIN_TOKEN, "--json")
    code, out, _ = run_cli(
        capsys,
        "tenant",
        "create",
        "globex",
        "--max-adapters",
        "5",
        "--max-stored-bytes",
        "1048576",
        *common,
    )
    assert code == 0 and json.loads(out)["quota"] == {
        "max_adapters": 5,
        "max_stored_bytes": 1048576,
    }
    code, out, _ = run_cli(
        capsys, "tenant", "set-quota", "globex", "--max-adapters", "default", *common
    )
    assert code == 0 and json.loads(out)["quota"] == {
        "max_adapters": None,
        "max_stored_bytes": 1048576,
    }
    code, out, _ = run_cli(capsys, "tenant", "list", *common)
    assert {t["name"]: t["quota"]["max_stored_bytes"] for t in json.loads(out)} == {
        "acme": None,
        "globex": 1048576,
    }
    code, out, _ = run_cli(capsys, "tenant", "list", *common[:-1])  # the table
    assert [line.split()[:4] for line in out.splitlines()] == [
        ["NAME", "ADAPTERS", "QUOTA_MAX_ADAPTERS", "QUOTA_MAX_STORED_BYTES"],
        ["acme", "0", "default", "default"],
        ["globex", "0", "default", "1048576"],
    ]
    code, out, _ = run_cli(capsys, "tenant", "set-quota", "globex", "--max-adapters", "-1", *common)
    assert code == 1 and "quota.max_adapters" in json.loads(out)["error"]["message"]
    code, _, err = run_cli(
        capsys, "tenant", "set-quota", "globex", "--url", live_server, "--admin-token", ADMIN_TOKEN
    )
    assert code == 1 and "give --max-adapters and/or --max-stored-bytes" in err
    code, _, err = run_cli(
        capsys, "tenant", "set-quota", "globex", "--max-adapters", "lots", *common
    )
    assert code == 2 and "expected a whole number or 'default'" in err


def test_tenant_unbound_user_setting(live_server, tenant_key, capsys):
    common = ("--url", live_server, "--admin-token", ADMIN_TOKEN, "--json")
    code, out, _ = run_cli(capsys, "tenant", "set-unbound-user", "acme", "not_found", *common)
    assert code == 0 and json.loads(out)["unbound_user"] == "not_found"
    code, out, _ = run_cli(capsys, "tenant", "show", "acme", *common)
    assert json.loads(out)["unbound_user"] == "not_found"
    code, out, _ = run_cli(capsys, "tenant", "set-unbound-user", "acme", "default", *common)
    assert code == 0 and json.loads(out)["unbound_user"] == "base_model"
    code, _, err = run_cli(capsys, "tenant", "set-unbound-user", "acme", "error", *common)
    assert code == 2 and "invalid choice" in err
