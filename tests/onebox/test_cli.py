"""Bad command lines and taken ports fail at once, with a clear message, starting nothing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from preft_serve.common.rank_caps import RANK_CAPS
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.onebox.__main__ import config_from, parser
from preft_serve.onebox.stack import OneBox, StackConfig
from tests.support.ports import free_port


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "preft_serve.onebox", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_taken_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _run(
            "--var",
            str(tmp_path),
            "--gateway-port",
            str(port),
            "--redis-port",
            str(free_port()),
            "--registry-port",
            str(free_port()),
            "--worker-port",
            str(free_port()),
        )
    assert done.returncode == 1
    assert f"port(s) already in use: {port} (--gateway-port)" in done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # no model generated, nothing started


def test_s3_endpoint_needs_an_s3_store(tmp_path: Path) -> None:
    done = _run("--var", str(tmp_path), "--s3-endpoint-url", "http://127.0.0.1:9000")
    assert done.returncode == 1
    assert "--s3-endpoint-url needs --object-store s3://bucket[/prefix]" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_s3_store_reaches_registry_and_worker(tmp_path: Path) -> None:
    config = StackConfig(
        var=tmp_path, object_store="s3://adapters/demo", s3_endpoint_url="http://127.0.0.1:9000"
    )
    stack = OneBox(config, say=lambda _: None)
    model = tmp_path / "model"
    argv, env = stack.registry_command(model)
    assert argv[argv.index("--object-store") + 1] == "s3://adapters/demo"
    assert env["PREFT_REGISTRY_OBJECT_STORE__S3_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert env["PREFT_REGISTRY_OBJECT_STORE__S3_CREATE_BUCKET"] == "true"
    worker = stack.worker_command(model)
    assert worker[worker.index("--object-store") + 1] == "s3://adapters/demo"
    assert worker[worker.index("--s3-endpoint-url") + 1] == "http://127.0.0.1:9000"


def test_default_store_is_a_directory_under_var(tmp_path: Path) -> None:
    stack = OneBox(StackConfig(var=tmp_path), say=lambda _: None)
    argv, env = stack.registry_command(tmp_path / "model")
    store = argv[argv.index("--object-store") + 1]
    assert Path(store) == (tmp_path / "run" / "objects").resolve()
    assert stack.worker_command(tmp_path / "model").count(store) == 1
    assert not any(k.startswith("PREFT_REGISTRY_OBJECT_STORE__S3") for k in env)


@pytest.mark.parametrize("flags", [[], ["--max-lora-rank", "64"]])
def test_registry_and_worker_get_one_lora_rank(tmp_path: Path, flags: list[str]) -> None:
    """The registry must refuse what the worker cannot serve ; one value feeds both."""
    config = config_from(parser().parse_args(["--var", str(tmp_path), *flags]))
    stack = OneBox(config, say=lambda _: None)
    _, env = stack.registry_command(tmp_path / "model")
    worker = stack.worker_command(tmp_path / "model")
    expected = str(flags[1] if flags else RANK_CAPS.max_lora_rank)
    assert env["PREFT_REGISTRY_MAX_LORA_RANK"] == expected
    assert worker[worker.index("--max-lora-rank") + 1] == expected


def test_tool_call_parser_reaches_the_worker_as_the_chart_renders_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker gets the parser and the gateway is told, so /v1/responses accepts tools."""

    def gateway_tool_calling(stack: OneBox) -> bool:
        _, env = stack.gateway_command(tmp_path / "model")
        for name in [n for n in os.environ if n.startswith("PREFT_")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return GatewaySettings(worker_urls=[stack.worker_url]).tool_calling

    config = config_from(
        parser().parse_args(["--var", str(tmp_path), "--toy", "--tool-call-parser", "hermes"])
    )
    stack = OneBox(config, say=lambda _: None)
    argv = stack.worker_command(tmp_path / "model")
    assert argv[-2:] == ["--enable-auto-tool-choice", "--tool-call-parser=hermes"]
    assert gateway_tool_calling(stack) is True
    plain = OneBox(
        config_from(parser().parse_args(["--var", str(tmp_path), "--toy"])), say=lambda _: None
    )
    assert "--enable-auto-tool-choice" not in plain.worker_command(tmp_path / "model")
    assert gateway_tool_calling(plain) is False
