"""``preft key ...`` and ``preft adapter policy | promote | canary | upload`` against
a real registry behind a real gateway, through the gateway's URL alone: what the CLI prints
is compared with the registry's own answer read directly, each key's role holds at the
gateway (an inference key chats but cannot upload, and sees the server's reason), a key's
secret is printed once, and bad input is refused before anything is sent (argparse exits 2
with a message that says what to fix; the registry's keys, policy and audit log stay as
they were)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from preft_serve.cli import client as cli_client
from preft_serve.cli import keys as cli_keys
from preft_serve.cli import policy as cli_policy
from preft_serve.registry import policy_schemas, schemas
from tests.cli.gateway_cli import adapter_dir, cli_json, login, registry_answer
from tests.fuzz.support import lora_files, upload_parts
from tests.gateway import test_tenant_forwarding as forwarding
from tests.gateway.test_tenant_forwarding import BASE, Stack
from tests.support.cli import run_cli
from tests.support.gateway import MSGS

model_dir, stack = forwarding.model_dir, forwarding.stack
NOWHERE = "http://127.0.0.1:9"  # nothing listens: a command that sent anything would say so


def _refused_locally(capsys: Any, fragment: str, *argv: str, code: int = 2) -> str:
    """``argv`` against a URL where nothing listens: refused with ``fragment`` in the
    message, never 'cannot reach' (so nothing was sent)."""
    got, out, err = run_cli(capsys, *argv, "--url", NOWHERE, "--api-key", "pft_x.y")
    assert got == code, (out, err)
    assert fragment in err, err
    assert "cannot reach" not in err
    return err


def test_the_cli_restates_the_registrys_bounds() -> None:
    assert cli_keys.ROLES == schemas.KEY_ROLES
    assert cli_keys.NAME_RE.pattern == schemas.KEY_NAME_PATTERN.strip("^$")
    assert (cli_keys.MIN_TTL_S, cli_keys.MAX_TTL_S) == (
        schemas.KEY_MIN_TTL_S,
        schemas.KEY_MAX_TTL_S,
    )
    assert cli_policy.MAX_VERSION == policy_schemas.MAX_VERSION


def test_keys_of_each_role_through_the_gateway(
    stack: Callable[..., Stack],
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    s = stack()
    admin = s.registry.tenant("acme")
    login(s, admin, capsys, monkeypatch, "acme")

    # Created with a name and a ttl: the secret once on stdout, the warning on stderr.
    before = dt.datetime.now(dt.UTC)
    code, out, err = run_cli(
        capsys, "key", "create", "--role", "inference", "--name", "chat-app", "--ttl", "30d"
    )
    assert code == 0, err
    assert "only time the key is shown" in err
    fields = dict(line.split(":", 1) for line in out.splitlines())
    inference = fields["api_key"].strip()
    assert out.count(inference) == 1 and inference not in err
    key_id = fields["key_id"].strip()
    stored = registry_answer(s, admin, f"/v1/keys/{key_id}")
    assert (stored["role"], stored["name"]) == ("inference", "chat-app")
    expiry = dt.datetime.fromisoformat(stored["expires_at"]) - before
    assert abs(expiry.total_seconds() - 30 * 86400) < 120
    assert inference.startswith(f"pft_{key_id}.")

    developer = cli_json(capsys, "key", "create", "--role", "developer")["api_key"]
    when = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).replace(microsecond=0)
    second_admin = cli_json(
        capsys, "key", "create", "--role", "admin", "--expires-at", when.isoformat()
    )
    assert dt.datetime.fromisoformat(second_admin["expires_at"]) == when

    # Listed as the registry lists them, never with a secret.
    listed = cli_json(capsys, "key", "list")
    assert listed == registry_answer(s, admin, "/v1/keys")
    assert sorted(k["role"] for k in listed) == ["admin", "admin", "developer", "inference"]
    code, out, err = run_cli(capsys, "key", "list")
    assert code == 0, err
    secret = inference.split(".", 1)[1]
    assert secret not in out and developer.split(".", 1)[1] not in out
    row = next(line for line in out.splitlines() if line.startswith(key_id)).split()
    assert row[1:3] == ["inference", "chat-app"]
    assert cli_json(capsys, "key", "show", key_id) == stored
    code, out, err = run_cli(capsys, "key", "show", key_id)
    assert code == 0 and f"key_id:      {key_id}" in out and secret not in out

    # The inference key chats through the gateway; an upload is refused with the server's
    # reason (the same message the registry gives directly).
    chat = s.call(inference, "POST", "/v1/chat/completions", json={"model": BASE, "messages": MSGS})
    assert chat.status_code == 200, chat.text
    reference = s.registry.call(
        inference,
        "POST",
        "/v1/adapters",
        data={"name": "bot", "mode": "prefill"},
        files=upload_parts(*lora_files(1)),
    )
    assert reference.status_code == 403, reference.text
    reason = reference.json()["error"]["message"]
    code, out, err = run_cli(
        capsys, "adapter", "upload", str(adapter_dir(tmp_path, 1)), "--name", "bot",
        "--mode", "prefill", "--quiet", "--api-key", inference,
    )  # fmt: skip
    assert code == 1 and f"error: {reason} (HTTP 403)" in err, err
    assert "inference" in reason
    assert cli_json(capsys, "adapter", "list")["items"] == []
    # A developer key uploads, but cannot manage keys.
    code, out, err = run_cli(
        capsys, "adapter", "upload", str(adapter_dir(tmp_path, 2)), "--name", "bot",
        "--mode", "prefill", "--quiet", "--api-key", developer,
    )  # fmt: skip
    assert code == 0, err
    code, out, err = run_cli(capsys, "key", "list", "--api-key", developer)
    assert code == 1 and "(HTTP 403)" in err and "admin" in err, err

    # Bad input against the live gateway: refused, and nothing stored or audited.
    keys_before, audit_before = (
        registry_answer(s, admin, "/v1/keys"),
        registry_answer(s, admin, "/v1/audit"),
    )
    for argv in (
        ["key", "create", "--role", "owner"],
        ["key", "create", "--role", "inference", "--ttl", "59s"],
        ["key", "revoke", inference],
    ):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and "error:" in err and out == "", (argv, err)
    assert inference not in err  # the key given by mistake is not echoed
    assert registry_answer(s, admin, "/v1/keys") == keys_before
    assert registry_answer(s, admin, "/v1/audit") == audit_before

    # Revoked: gone from the list, refused at the gateway, a 404 to show.
    code, out, err = run_cli(capsys, "key", "revoke", key_id)
    assert code == 0 and out == "ok\n", err
    assert key_id not in {k["key_id"] for k in registry_answer(s, admin, "/v1/keys")}
    chat = s.call(inference, "POST", "/v1/chat/completions", json={"model": BASE, "messages": MSGS})
    assert chat.status_code == 401, chat.text
    code, out, err = run_cli(capsys, "key", "show", key_id)
    assert code == 1 and "(HTTP 404)" in err, err

    # The last admin key stays; the refusal names the CLI command that helps.
    code, out, err = run_cli(capsys, "key", "revoke", second_admin["key_id"])
    assert code == 0, err
    own = admin.removeprefix("pft_").split(".", 1)[0]
    code, out, err = run_cli(capsys, "key", "revoke", own)
    assert code == 1 and "(HTTP 409)" in err, err
    assert "last admin key" in err and "`preft key create --role admin`" in err, err
    assert own in {k["key_id"] for k in registry_answer(s, admin, "/v1/keys")}


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["key", "create", "--role", "owner"], "use one of admin, developer, inference"),
        (["key", "create"], "the following arguments are required: --role"),
        (["key", "create", "--role", "admin", "--ttl", "10s"], "use 60 seconds to 1825 days"),
        (["key", "create", "--role", "admin", "--ttl", "2000d"], "use 60 seconds to 1825 days"),
        (["key", "create", "--role", "admin", "--ttl", "soon"], "is not a duration"),
        (["key", "create", "--role", "admin", "--ttl", "9" * 500], "is not a duration"),
        (
            [
                "key",
                "create",
                "--role",
                "admin",
                "--ttl",
                "1d",
                "--expires-at",
                "2030-01-01T00:00:00Z",
            ],
            "not allowed with argument",
        ),
        (["key", "create", "--role", "admin", "--expires-at", "2030-01-01"], "with an offset"),
        (
            ["key", "create", "--role", "admin", "--expires-at", "2030-01-01T00:00:00"],
            "with an offset",
        ),
        (
            ["key", "create", "--role", "admin", "--expires-at", "2020-01-01T00:00:00Z"],
            "must lie 60 seconds to 1825 days from now",
        ),
        (["key", "create", "--role", "admin", "--name", "a/b"], "use 1-64 letters"),
        (["key", "create", "--role", "admin", "--name", "x" * 65], "use 1-64 letters"),
        (["key", "revoke", "pft_0123456789ab.secret"], "not the key itself"),
        (["key", "show", "XYZ"], "use the 12 hex digits"),
        (["adapter", "policy", "bad..name"], "adapter name 'bad..name' is invalid"),
        (["adapter", "policy", "bot", "--user", "a b"], "user id 'a b' is invalid"),
        (["adapter", "promote", "bot", "0"], "use a version number"),
        (["adapter", "promote", "bot", "1" * 10], "use a version number"),
        (["adapter", "canary", "bot", "2", "--weight", "1.5"], "strictly between 0 and 1"),
        (["adapter", "canary", "bot", "2", "--weight", "0"], "strictly between 0 and 1"),
        (["adapter", "canary", "bot", "2", "--weight", "0.12345"], "more than 4 decimals"),
        (["adapter", "canary", "bot", "2", "--weight", "nan"], "strictly between 0 and 1"),
        (["adapter", "canary", "bot", "2", "--weight", "lots"], "is not a number"),
    ],
)
def test_bad_input_is_refused_before_anything_is_sent(
    capsys: Any, argv: list[str], fragment: str
) -> None:
    err = _refused_locally(capsys, fragment, *argv)
    assert "9" * 100 not in err  # a long value is cut before it is echoed


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["adapter", "canary", "bot", "2"], "--weight is required"),
        (["adapter", "canary", "bot"], "give a canary VERSION with --weight, or --off"),
        (
            ["adapter", "canary", "bot", "2", "--off"],
            "give a canary VERSION with --weight, or --off",
        ),
        (["adapter", "canary", "bot", "--off", "--weight", "0.1"], "not with --off"),
    ],
)
def test_contradictory_canary_flags_are_refused_before_anything_is_sent(
    capsys: Any, argv: list[str], fragment: str
) -> None:
    _refused_locally(capsys, fragment, *argv, code=1)


def test_staged_upload_promote_canary_and_rollback(
    stack: Callable[..., Stack],
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    s = stack()
    key = s.registry.tenant("acme")
    login(s, key, capsys, monkeypatch, "acme")
    policy = "/v1/adapters/bot/policy"

    def upload(seed: int, *flags: str) -> Any:
        return cli_json(
            capsys, "adapter", "upload", str(adapter_dir(tmp_path, seed)), "--name", "bot",
            "--quiet", *flags,
        )  # fmt: skip

    upload(1, "--mode", "prefill")
    staged = upload(2, "--new-version")
    assert (staged["version"], staged["state"]) == (2, "staged")
    direct = registry_answer(s, key, policy)
    assert direct["version"] == 1 and direct["canary"] is None
    assert {v["version"]: v["state"] for v in direct["versions"]} == {1: "serving", 2: "staged"}
    assert cli_json(capsys, "adapter", "policy", "bot") == direct
    code, out, err = run_cli(capsys, "adapter", "policy", "bot")
    assert code == 0, err
    assert "serving:     version 1 (" in out and "canary:      none" in out
    states = {line.split()[0]: line.split()[1] for line in out.splitlines() if line[:1].isdigit()}
    assert states == {"1": "serving", "2": "staged"}

    # Canary: version 2 for 10% of users, version 1 stays served.
    code, out, err = run_cli(capsys, "adapter", "canary", "bot", "2", "--weight", "0.1")
    assert code == 0, err
    assert "canary:      version 2 (" in out and "for 10.00% of users" in out
    direct = registry_answer(s, key, policy)
    assert direct["version"] == 1
    assert (direct["canary"]["version"], direct["canary"]["weight"]) == (2, 0.1)
    # Each user's version, as the CLI reports it, is the one the gateway serves them.
    for user in ("alice", "bob", "carol", "dave"):
        shown = cli_json(capsys, "adapter", "policy", "bot", "--user", user)
        assert shown == registry_answer(s, key, policy, user=user)
        chat = s.call(
            key,
            "POST",
            "/v1/chat/completions",
            json={"model": "bot", "messages": MSGS, "user": user},
        )
        assert chat.status_code == 200, chat.text
        assert chat.headers["x-preft-adapter-version"] == str(shown["user"]["version"])
    code, out, err = run_cli(capsys, "adapter", "policy", "bot", "--user", "alice")
    pick = registry_answer(s, key, policy, user="alice")["user"]
    assert f"user:        alice gets version {pick['version']} ({pick['variant']})" in out

    # Refused before sending, or by the registry (no version 9): nothing changed.
    before = registry_answer(s, key, policy)
    audit_before = registry_answer(s, key, "/v1/audit")
    for argv in (["2", "--weight", "1.5"], ["2"], ["--off", "--weight", "0.5"]):
        code, out, err = run_cli(capsys, "adapter", "canary", "bot", *argv)
        assert code in (1, 2) and "error:" in err and "HTTP" not in err, (argv, err)
    assert registry_answer(s, key, "/v1/audit") == audit_before
    code, out, err = run_cli(capsys, "adapter", "canary", "bot", "9", "--weight", "0.2")
    assert code == 1 and "(HTTP 404)" in err and "9" in err, err
    code, out, err = run_cli(capsys, "adapter", "promote", "bot", "9")
    assert code == 1 and "(HTTP 404)" in err, err
    assert registry_answer(s, key, policy) == before

    code, out, err = run_cli(capsys, "adapter", "canary", "bot", "--off")
    assert code == 0 and "canary:      none" in out, err
    direct = registry_answer(s, key, policy)
    assert (direct["version"], direct["canary"]) == (1, None)

    # Someone promotes version 2 between the canary command's read and its change: the
    # change is refused (it named version 1 as served) and version 2 stays served.
    read = cli_client.Registry.answer

    def promoted_meanwhile(reg: Any, method: str, path: str, **kwargs: Any) -> Any:
        answer = read(reg, method, path, **kwargs)
        assert s.call(key, "POST", "/v1/adapters/bot/versions/2/promote").status_code == 200
        return answer

    monkeypatch.setattr(cli_client.Registry, "answer", promoted_meanwhile)
    code, out, err = run_cli(capsys, "adapter", "canary", "bot", "2", "--weight", "0.5")
    monkeypatch.setattr(cli_client.Registry, "answer", read)
    assert code == 1 and "(HTTP 412)" in err and "changed since it was read" in err, err
    direct = registry_answer(s, key, policy)
    assert (direct["version"], direct["canary"]) == (2, None)
    assert s.call(key, "POST", "/v1/adapters/bot/versions/1/promote").status_code == 200

    promoted = cli_json(capsys, "adapter", "promote", "bot", "2")
    assert promoted == registry_answer(s, key, policy)
    assert promoted["version"] == 2 and promoted["canary"] is None
    assert {v["version"]: v["state"] for v in promoted["versions"]} == {
        1: "retired",
        2: "serving",
    }

    # Rollback still writes version 1's content as a new version, which serves.
    code, out, err = run_cli(capsys, "adapter", "rollback", "bot", "1")
    assert code == 0, err
    direct = registry_answer(s, key, policy)
    assert direct["version"] == 3
    assert direct["sha256"] == next(v["sha256"] for v in direct["versions"] if v["version"] == 1)

    # A new adapter's first version serves; a later one is staged unless --promote, and
    # the CLI says how to go on.
    def fresh(seed: int, *flags: str) -> tuple[int, str]:
        code, _, err = run_cli(
            capsys, "adapter", "upload", str(adapter_dir(tmp_path, seed)), "--name", "fresh",
            "--quiet", *flags,
        )  # fmt: skip
        assert code == 0, err
        return registry_answer(s, key, "/v1/adapters/fresh/policy")["version"], err

    assert fresh(5, "--mode", "prefill") == (1, "")
    served, err = fresh(6, "--new-version")
    assert served == 1 and "version 2 is staged" in err and "fresh@2" in err, err
    assert fresh(7, "--new-version", "--promote") == (3, "")


def test_every_new_command_explains_itself_with_an_example(capsys: Any) -> None:
    for argv in (
        ["key", "create"],
        ["key", "list"],
        ["key", "show"],
        ["key", "revoke"],
        ["adapter", "policy"],
        ["adapter", "promote"],
        ["adapter", "canary"],
        ["adapter", "upload"],
        ["adapter", "rollback"],
    ):
        code, out, err = run_cli(capsys, *argv, "--help")
        assert code == 0, err
        assert "example" in out and f"preft {' '.join(argv)}" in out, (argv, out)
