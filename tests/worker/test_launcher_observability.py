"""The worker launcher's ``--log-json`` and tracing flags (no vLLM engine is started).

``--log-json`` writes preft's JSON handler as a dictConfig file and points
``VLLM_LOGGING_CONFIG_PATH`` at it; vLLM applies that file in each of its processes and hands
it to uvicorn, so vLLM's loggers, uvicorn's access lines and the plugin's own logs are one
JSON object per line. The tracing flags become vLLM's ``--otlp-traces-endpoint`` and the
``OTEL_*`` variables its tracer reads.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from preft_serve.common.logging import dict_config
from preft_serve.worker import serve

LAUNCHER_ENV = (
    "VLLM_LOGGING_CONFIG_PATH",
    "VLLM_CONFIGURE_LOGGING",
    "VLLM_LOGGING_LEVEL",
    "OTEL_SERVICE_NAME",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
)
KEY = "pft_0a1b2c3d4e5f.Zm9vYmFyYmF6cXV4cXV1eGNvcmdlZ3JhdWx0Z2FycGx5"

# Run in a fresh interpreter: logging configuration is process-wide. Logs a vLLM line, a
# uvicorn access line and a plugin line; each must come out as one JSON object.
EMIT = """
import logging
vllm = logging.getLogger("vllm.v1.engine.async_llm")
vllm.info("Added request chatcmpl-3f2c9e.")
vllm.debug("hidden below INFO")
logging.getLogger("uvicorn.access").info(
    '%s - "%s %s HTTP/%s" %d', "10.0.0.7:5123", "POST", "/v1/chat/completions", "1.1", 200)
logging.getLogger("preft_serve.worker.adapter_tiers.resolver").warning("key %s refused", KEY)
"""


@pytest.fixture
def launcher_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No inherited vLLM/OTel variables; whatever the launcher sets is undone; temp files
    under tmp_path."""
    for name in LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    return monkeypatch


def args(*flags: str) -> Any:
    parsed, _ = serve.parser().parse_known_args(["--model", "m", *flags])
    return parsed


def json_lines(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.strip()]


def check_lines(lines: list[dict[str, Any]]) -> None:
    vllm, access, plugin = lines  # the DEBUG line is below the level
    assert vllm["level"] == "INFO" and vllm["logger"] == "vllm.v1.engine.async_llm"
    assert vllm["message"] == "Added request chatcmpl-3f2c9e."
    assert vllm["request_id"] == "chatcmpl-3f2c9e"
    assert access["logger"] == "uvicorn.access"
    assert access["message"] == '10.0.0.7:5123 - "POST /v1/chat/completions HTTP/1.1" 200'
    assert plugin["level"] == "WARNING"
    assert plugin["logger"] == "preft_serve.worker.adapter_tiers.resolver"
    assert plugin["message"] == "key pft_0a1b2c3d4e5f.*** refused"
    assert all({"ts", "level", "logger", "message"} <= set(line) for line in lines)


def test_log_json_points_vllm_at_a_dict_config_file(
    launcher_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    launcher_env.setenv("VLLM_LOGGING_LEVEL", "warning")
    env = serve.logging_env(args("--log-json"))
    path = Path(env.pop("VLLM_LOGGING_CONFIG_PATH"))
    assert env == {} and path.parent == tmp_path and path.suffix == ".json"
    assert json.loads(path.read_text()) == dict_config("WARNING", json_output=True)
    assert serve.logging_env(args()) == {}  # text logs: vLLM's own format, untouched


@pytest.mark.parametrize(
    "name,value,hint",
    [
        ("VLLM_LOGGING_CONFIG_PATH", "/etc/mine.json", "unset VLLM_LOGGING_CONFIG_PATH"),
        ("VLLM_CONFIGURE_LOGGING", "0", "unset VLLM_CONFIGURE_LOGGING=0"),
    ],
)
def test_log_json_refuses_a_conflicting_environment(
    launcher_env: pytest.MonkeyPatch, name: str, value: str, hint: str
) -> None:
    launcher_env.setenv(name, value)
    with pytest.raises(SystemExit, match=hint):
        serve.logging_env(args("--log-json"))


def test_the_file_configures_logging_through_dict_config(launcher_env: pytest.MonkeyPatch) -> None:
    """What vLLM does with the file: json.load, then logging.config.dictConfig."""
    path = serve.logging_env(args("--log-json"))["VLLM_LOGGING_CONFIG_PATH"]
    script = (
        f"import json, logging.config\nKEY = {KEY!r}\n"
        f"logging.config.dictConfig(json.load(open({path!r})))\n{EMIT}"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    check_lines(json_lines(done.stderr))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_vllm_and_its_uvicorn_apply_the_file(launcher_env: pytest.MonkeyPatch) -> None:
    """vLLM's own path: each process applies LoggingConfig() (which reads
    VLLM_LOGGING_CONFIG_PATH), and the API server passes the same file to uvicorn."""
    env = serve.logging_env(args("--log-json"))
    script = (
        textwrap.dedent(f"""
        import argparse
        import sys
        import uvicorn
        from vllm.config.logging import LoggingConfig
        from vllm.entrypoints.launchers.utils.server_utils import get_uvicorn_log_config
        from vllm.logger import configure_logging

        KEY = {KEY!r}
        sys.stderr.write("--- imported\\n")  # import-time notes come before any config
        config = LoggingConfig()
        assert config.pylogging_config_file == {env["VLLM_LOGGING_CONFIG_PATH"]!r}
        configure_logging(config)
        ns = argparse.Namespace(logging_config=config, disable_access_log_for_endpoints=None,
                                uvicorn_log_level="info")
        log_config = get_uvicorn_log_config(ns)
        assert log_config is not None
        uvicorn.Config(app=lambda *a: None, log_config=log_config, log_level="info")
    """)
        + EMIT
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    # vLLM may log platform notes of its own first; ours are the last three lines.
    lines = json_lines(done.stderr.split("--- imported\n", 1)[1])
    check_lines(lines[-3:])
    assert all(line["logger"].startswith("vllm") for line in lines[:-3])


def test_tracing_flags_become_vllm_flags_and_otel_variables() -> None:
    traced = args(
        "--otlp-traces-endpoint", "http://collector:4317", "--otlp-traces-protocol", "http/protobuf"
    )
    assert serve.tracing_env(traced) == {
        "OTEL_SERVICE_NAME": "preft-worker",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    }
    argv = serve.vllm_argv(traced, [])
    assert argv[argv.index("--otlp-traces-endpoint") + 1] == "http://collector:4317"
    plain = args()
    assert serve.tracing_env(plain) == {} and "--otlp-traces-endpoint" not in serve.vllm_argv(
        plain, []
    )
    with pytest.raises(SystemExit, match="needs --otlp-traces-endpoint"):
        serve.tracing_env(args("--otlp-traces-protocol", "grpc"))


def test_main_exports_everything_before_exec(launcher_env: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_exec(path: str, argv: list[str]) -> None:
        seen.update(argv=argv, env=dict(os.environ))

    launcher_env.setattr(os, "execv", fake_exec)
    serve.main(
        [
            "--model",
            "m",
            "--log-json",
            "--otlp-traces-endpoint",
            "http://c:4317",
            "--tracing-service-name",
            "worker-a",
        ]
    )
    assert Path(seen["env"]["VLLM_LOGGING_CONFIG_PATH"]).is_file()
    assert seen["env"]["OTEL_SERVICE_NAME"] == "worker-a"
    assert "--otlp-traces-endpoint" in seen["argv"] and "--log-json" not in seen["argv"]
