"""``--role``: what the launcher hands vLLM for unified, prefill and decode workers."""

from __future__ import annotations

import json
import subprocess

import pytest

from preft_serve.worker import serve
from preft_serve.worker.net_devices import tcp_only


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
    for name in (*serve.CPU_POOL_ENV, "UCX_NET_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    argv = argv_of("--role", "decode", "--kv-port", "5611", "--kv-host", "127.0.0.1")
    for adapter_flag in ("--enable-lora", "--max-loras", "--scheduler-cls", "--worker-cls"):
        assert adapter_flag not in argv
    assert "--no-enable-prefix-caching" in argv  # received KV is never shared
    config = transfer_config(argv)
    assert (config["kv_role"], config["kv_load_failure_policy"]) == ("kv_consumer", "fail")
    args = serve.parser().parse_args(
        ["--model", "m", "--role", "decode", "--kv-port", "5611", "--kv-host", "127.0.0.1"]
    )
    assert serve.pool_env(args) == {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": "5611",
        "UCX_NET_DEVICES": loopback_interface(),
        **serve.CPU_POOL_ENV,
    }


def test_an_operators_transport_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UCX_TLS", "rc,cuda_copy")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.delenv("UCX_NET_DEVICES", raising=False)
    args = serve.parser().parse_args(["--model", "m", "--role", "prefill"])
    # InfiniBand in play: no device list the launcher could know
    assert not {*serve.CPU_POOL_ENV, "UCX_NET_DEVICES"} & set(serve.pool_env(args))
    monkeypatch.setenv("UCX_TLS", "tcp")
    monkeypatch.setenv("UCX_NET_DEVICES", "eth7")
    assert "UCX_NET_DEVICES" not in serve.pool_env(args)


def loopback_interface() -> str:
    """The interface holding 127.0.0.1, read from the kernel by ``ip`` (not by the code
    under test)."""
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    return next(line.split()[1] for line in out.splitlines() if " 127.0.0.1/" in line)


def outside_address() -> tuple[str, str]:
    """A non-loopback IPv4 address of this host and its interface (``ip``), or skip."""
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        fields = line.split()
        return fields[3].split("/")[0], fields[1]
    pytest.skip("this host has no non-loopback IPv4 address")


@pytest.mark.parametrize("tls", ["tcp,self", "tcp", "tcp,cuda_copy,sm"])
def test_ucx_listens_on_the_kv_hosts_interface(monkeypatch: pytest.MonkeyPatch, tls: str) -> None:
    monkeypatch.setenv("UCX_TLS", tls)
    monkeypatch.delenv("UCX_NET_DEVICES", raising=False)
    address, interface = outside_address()
    for role in ("prefill", "decode"):
        args = serve.parser().parse_args(["--model", "m", "--role", role, "--kv-host", address])
        assert serve.pool_env(args)["UCX_NET_DEVICES"] == interface
    local = serve.parser().parse_args(["--model", "m", "--role", "decode"])  # 127.0.0.1
    assert serve.pool_env(local)["UCX_NET_DEVICES"] == loopback_interface()
    by_name = serve.parser().parse_args(
        ["--model", "m", "--role", "decode", "--kv-host", "localhost"]
    )
    assert serve.pool_env(by_name)["UCX_NET_DEVICES"] == loopback_interface()
    unified = serve.parser().parse_args(["--model", "m", "--kv-host", address])
    assert serve.pool_env(unified) == {}  # no KV transfer, no UCX


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("198.51.100.254", "no interface of this host has address '198.51.100.254'"),
        ("0.0.0.0", "'0.0.0.0' is a wildcard: name one interface's address"),
        ("::", "'::' is a wildcard"),
        ("no-such-host.invalid", "'no-such-host.invalid' does not resolve"),
    ],
)
def test_a_kv_host_no_interface_holds_is_refused(
    monkeypatch: pytest.MonkeyPatch, host: str, why: str
) -> None:
    monkeypatch.setenv("UCX_TLS", "tcp,self")
    monkeypatch.delenv("UCX_NET_DEVICES", raising=False)
    args = serve.parser().parse_args(["--model", "m", "--role", "prefill", "--kv-host", host])
    with pytest.raises(SystemExit, match="--kv-host") as refused:
        serve.pool_env(args)
    assert why in str(refused.value)
    assert "pod IP" in str(refused.value)


@pytest.mark.parametrize(
    ("tls", "want"),
    [
        ("tcp,self", True),
        ("TCP", True),
        ("tcp,cuda_copy,cuda_ipc,sm", True),
        (None, False),
        ("", False),
        ("^ib", False),
        ("rc,tcp", False),
        ("ud_x,tcp", False),
        ("dc_mlx5", False),
        ("all", False),
        ("ib,tcp", False),
    ],
)
def test_only_a_tcp_only_transport_list_gets_a_device(tls: str | None, want: bool) -> None:
    assert tcp_only(tls) is want


@pytest.mark.parametrize("flag", [["--adapter-dir", "/tmp"], ["--object-store", "s3://b"]])
def test_decode_refuses_adapter_sources(flag: list[str]) -> None:
    with pytest.raises(SystemExit, match="a decode worker holds no adapter"):
        argv_of("--role", "decode", *flag)


@pytest.mark.parametrize(
    ("env", "flags", "want"),
    [
        ({}, [], {}),  # vLLM's multiprocess executor: the model has a process of its own
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, [], {"OMP_WAIT_POLICY": "PASSIVE"}),
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_WAIT_POLICY": "ACTIVE"}, [], {}),
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, ["--device", "gpu"], {}),
    ],
    ids=["multiprocess", "engine-core", "operator-wins", "gpu"],
)
def test_openmp_waits_passively_beside_the_engine_cores_threads(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], flags: list[str], want: dict[str, str]
) -> None:
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
