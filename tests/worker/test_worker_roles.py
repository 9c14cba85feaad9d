"""``--role``: what the launcher hands vLLM for unified, prefill and decode workers."""

from __future__ import annotations

import json

import pytest

from preft_serve.worker import serve


def argv_of(*flags: str) -> list[str]:
    args, passthrough = serve.parser().parse_known_args(["--model", "m", *flags])
    return serve.vllm_argv(args, passthrough)


def transfer_config(argv: list[str]) -> dict[str, object]:
    return json.loads(argv[argv.index("--kv-transfer-config") + 1])  # type: ignore[no-any-return]


def test_unified_is_the_default_and_transfers_no_kv() -> None:
    argv = argv_of()
    assert "--enable-lora" in argv and "--kv-transfer-config" not in argv
    args = serve.parser().parse_args(["--model", "m"])
    assert args.role == "unified" and serve.pool_env(args) == {}


def test_prefill_keeps_adapters_and_produces_kv() -> None:
    argv = argv_of("--role", "prefill", "--kv-lease-s", "12")
    assert "--enable-lora" in argv and "--max-loras" in argv
    config = transfer_config(argv)
    assert config["kv_role"] == "kv_producer"
    assert config["kv_connector_extra_config"] == {"kv_lease_duration": 12}


def test_decode_runs_the_base_model_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in serve.CPU_POOL_ENV:
        monkeypatch.delenv(name, raising=False)
    argv = argv_of("--role", "decode", "--kv-port", "5611", "--kv-host", "10.1.2.3")
    for adapter_flag in ("--enable-lora", "--max-loras", "--scheduler-cls", "--worker-cls"):
        assert adapter_flag not in argv
    assert "--no-enable-prefix-caching" in argv  # received KV is never shared
    config = transfer_config(argv)
    assert (config["kv_role"], config["kv_load_failure_policy"]) == ("kv_consumer", "fail")
    args = serve.parser().parse_args(["--model", "m", "--role", "decode", "--kv-port",
                                      "5611", "--kv-host", "10.1.2.3"])
    assert serve.pool_env(args) == {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.1.2.3",
                                    "VLLM_NIXL_SIDE_CHANNEL_PORT": "5611",
                                    **serve.CPU_POOL_ENV}


def test_an_operators_transport_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UCX_TLS", "rc,cuda_copy")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    args = serve.parser().parse_args(["--model", "m", "--role", "prefill"])
    assert not set(serve.CPU_POOL_ENV) & set(serve.pool_env(args))


@pytest.mark.parametrize("flag", [["--adapter-dir", "/tmp"], ["--object-store", "s3://b"]])
def test_decode_refuses_adapter_sources(flag: list[str]) -> None:
    with pytest.raises(SystemExit, match="a decode worker holds no adapter"):
        argv_of("--role", "decode", *flag)


@pytest.mark.parametrize(("env", "flags", "want"), [
    ({}, [], {}),  # vLLM's multiprocess executor: the model has a process of its own
    ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, [], {"OMP_WAIT_POLICY": "PASSIVE"}),
    ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_WAIT_POLICY": "ACTIVE"}, [], {}),
    ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, ["--device", "gpu"], {}),
], ids=["multiprocess", "engine-core", "operator-wins", "gpu"])
def test_openmp_waits_passively_beside_the_engine_cores_threads(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], flags: list[str],
        want: dict[str, str]) -> None:
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = serve.parser().parse_args(["--model", "m", *flags])
    assert serve.omp_env(args) == want


def test_cpu_pool_roles_get_the_passive_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool roles choose the engine-core layout on CPU, so they wait passively too."""
    for name in (*serve.CPU_POOL_ENV, "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    args = serve.parser().parse_args(["--model", "m", "--role", "prefill"])
    for name, value in serve.pool_env(args).items():
        monkeypatch.setenv(name, value)
    assert serve.omp_env(args) == {"OMP_WAIT_POLICY": "PASSIVE"}
