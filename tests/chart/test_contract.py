"""The rendered pods configure the real services: every PREFT_* variable is a setting the
service reads and the settings validate; probes and scrapes hit endpoints the apps really
serve; the worker's command line is accepted by our launcher and by vLLM's own parser."""

from __future__ import annotations

import json
import secrets
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, TypeAdapter

from preft_serve.gateway.app import create_app as create_gateway
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.registry.app import create_app as create_registry
from preft_serve.registry.settings import Bytes, RegistrySettings
from preft_serve.worker import serve
from preft_serve.worker.decode_slots import reserved_slots, tenant_slots
from preft_serve.worker.settings import WorkerSettings
from tests.chart.manifests import container, container_port, env, pod_spec
from tests.chart.support import CHART, SCENARIOS, Rendered

ALL = list(SCENARIOS)
# A small Llama config.json, enough for the registry's settings check.
MODEL_CONFIG = (
    '{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, '
    '"num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 256}'
)


def with_secrets(values: dict[str, str]) -> dict[str, str]:
    """Secret markers replaced by random strings, as the kubelet would inject real ones."""
    fake: dict[str, str] = {}
    out = {}
    for name, raw in values.items():
        value = raw
        for marker in [v for v in values.values() if v.startswith("secret.")]:
            fake.setdefault(marker, secrets.token_urlsafe(24))
            value = value.replace(marker, fake[marker])
        out[name] = value
    return out


def settings_fields(model: type[Any], prefix: str) -> set[str]:
    """Every environment variable a pydantic-settings class reads (nested with ``__``)."""
    names = set()
    for field, info in model.model_fields.items():
        names.add(f"{prefix}{field.upper()}")
        # Nested models (the object store, the registry's finetune settings), recursively.
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            names |= settings_fields(info.annotation, f"{prefix}{field.upper()}__")
    return names


def service_env(rendered: Rendered, component: str, prefix: str) -> dict[str, str]:
    values = env(container(rendered.component("Deployment", component)))
    return {k: v for k, v in values.items() if k.startswith(prefix)}


@pytest.mark.parametrize("scenario", ALL)
def test_every_preft_variable_is_a_real_setting(
    scenarios: dict[str, Rendered], scenario: str
) -> None:
    """pydantic-settings ignores unknown variables, so a typo would be silently lost."""
    rendered = scenarios[scenario]
    for component, model, prefix in [
        ("gateway", GatewaySettings, "PREFT_GATEWAY_"),
        ("registry", RegistrySettings, "PREFT_REGISTRY_"),
        ("worker", WorkerSettings, "PREFT_WORKER_"),
    ]:
        names = set(service_env(rendered, component, prefix))
        assert names, component
        unknown = names - settings_fields(model, prefix)
        assert not unknown, f"{component} reads no {sorted(unknown)}"


@pytest.fixture
def gateway_app(
    request: pytest.FixtureRequest, scenarios: dict[str, Rendered], clean_env: pytest.MonkeyPatch
) -> Iterator[tuple[GatewaySettings, FastAPI]]:
    rendered = scenarios[request.param]
    for name, value in with_secrets(service_env(rendered, "gateway", "PREFT_GATEWAY_")).items():
        clean_env.setenv(name, value)
    settings = GatewaySettings()  # type: ignore[call-arg]
    return settings, create_gateway(settings)


@pytest.mark.parametrize("gateway_app", ALL, indirect=True)
def test_gateway_settings_and_probes(
    gateway_app: tuple[GatewaySettings, FastAPI], scenarios: dict[str, Rendered], request: Any
) -> None:
    settings, app = gateway_app
    rendered = scenarios[request.node.callspec.params["gateway_app"]]
    workload = rendered.component("Deployment", "gateway")
    spec = container(workload)
    assert settings.host == "0.0.0.0"
    assert settings.port == container_port(spec, "http")
    assert settings.discovery in ("kubernetes", "dns")
    _check_probes(app, spec, liveness="/healthz", readiness="/readyz")


@pytest.mark.parametrize("scenario", ALL)
def test_registry_settings_and_probes(
    scenarios: dict[str, Rendered], scenario: str, clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rendered = scenarios[scenario]
    workload = rendered.component("Deployment", "registry")
    spec = container(workload)
    values = with_secrets(service_env(rendered, "registry", "PREFT_REGISTRY_"))
    # The base model path as the pod sees it, laid out under tmp_path.
    mounts = {m["mountPath"]: m["name"] for m in spec["volumeMounts"]}
    base = values["PREFT_REGISTRY_BASE_MODEL"]
    mount = next(m for m in mounts if base.startswith(m + "/"))
    local = tmp_path / base.removeprefix("/")
    if base.endswith(".json"):
        (config_map,) = [
            c for c in rendered.of_kind("ConfigMap") if "config.json" in c.get("data", {})
        ]
        assert mounts[mount] == "base-model-config"
        local.parent.mkdir(parents=True)
        local.write_text(config_map["data"]["config.json"])
    else:
        assert mounts[mount] == "model"
        local.mkdir(parents=True)
        (local / "config.json").write_text(MODEL_CONFIG)
    values["PREFT_REGISTRY_BASE_MODEL"] = str(local)
    for name, value in values.items():
        clean_env.setenv(name, value)
    settings = RegistrySettings()  # type: ignore[call-arg]
    assert settings.host == "0.0.0.0"
    assert settings.port == container_port(spec, "http")
    assert settings.object_store.url.startswith("s3://")
    assert str(settings.staging_dir) in [m["mountPath"] for m in spec["volumeMounts"]]
    # Spooled bodies land on the staging volume too, and the count stays under its size.
    assert env(spec)["TMPDIR"] == str(settings.staging_dir)
    staging = mounts[str(settings.staging_dir)]
    (volume,) = [v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == staging]
    size_limit = TypeAdapter(Bytes).validate_python(volume["emptyDir"]["sizeLimit"])
    assert settings.largest_transfer_bytes <= settings.tenant_scratch_share
    assert settings.scratch_bytes <= size_limit - (2 << 30)  # a registration's two copies
    assert len(settings.admin_token.get_secret_value()) >= 16
    _check_probes(create_registry(settings), spec, liveness="/healthz", readiness="/readyz")


def _check_probes(app: FastAPI, spec: dict[str, Any], *, liveness: str, readiness: str) -> None:
    """The probes' paths are routes of ``app`` on the container's port; /healthz answers 200
    without any backend, and /metrics serves Prometheus text."""
    assert spec["livenessProbe"]["httpGet"]["path"] == liveness
    assert spec["readinessProbe"]["httpGet"]["path"] == readiness
    for probe in ("livenessProbe", "readinessProbe"):
        container_port(spec, spec[probe]["httpGet"]["port"])
    client = TestClient(app, raise_server_exceptions=False)  # no lifespan: no Redis needed
    assert client.get(liveness).status_code == 200
    assert client.get(readiness).status_code not in (404, 405)
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")


@pytest.mark.parametrize("scenario", ALL)
def test_worker_launcher_accepts_the_command_line(
    scenarios: dict[str, Rendered], scenario: str, clean_env: pytest.MonkeyPatch
) -> None:
    rendered = scenarios[scenario]
    spec = container(rendered.component("Deployment", "worker"))
    assert spec["command"] == ["python3", "-m", "preft_serve.worker.serve"]
    args, passthrough = serve.parser().parse_known_args(spec["args"])
    assert args.host == "0.0.0.0"
    assert args.port == container_port(spec, "http")
    # What the launcher exports, plus the pod's own PREFT_WORKER_* variables.
    pod_env = with_secrets(service_env(rendered, "worker", "PREFT_WORKER_"))
    for name, value in {**pod_env, **serve.resolver_env(args)}.items():
        clean_env.setenv(name, value)
    settings = WorkerSettings()
    assert settings.resolver_enabled
    # Some adapter slots stay free for prefill-only adapters, and the worker's scheduler
    # accepts the count (it refuses one that leaves classic adapters no slot).
    classic = args.max_loras - reserved_slots(args.max_loras, settings.prefill_reserved_slots)
    assert 0 < classic < args.max_loras
    share = tenant_slots(classic, settings.tenant_classic_slots)
    assert 0 < share < classic  # one tenant never holds every classic slot
    gateway = service_env(rendered, "gateway", "PREFT_GATEWAY_")
    # The gateway spills a tenant's classic adapters where a worker would hold them back.
    assert int(gateway["PREFT_GATEWAY_TENANT_CLASSIC_ADAPTERS_PER_WORKER"]) == share
    assert settings.registry_redis_url is not None  # hot-swap prefetch
    assert settings.adapter_cache_bytes == int(args.adapter_cache_gib * (1 << 30))
    assert all(a.startswith("--") for a in passthrough)


@pytest.fixture(scope="module")
def vllm_parser() -> Any:
    """vLLM's own OpenAI-server argument parser (importing vLLM takes a few seconds)."""
    return pytest.importorskip("vllm.entrypoints.launchers.cli_args")


@pytest.mark.parametrize("scenario", ALL)
def test_vllm_accepts_the_worker_command_line(
    vllm_parser: Any, scenarios: dict[str, Rendered], scenario: str
) -> None:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    rendered = scenarios[scenario]
    workload = rendered.component("Deployment", "worker")
    spec = container(workload)
    args, passthrough = serve.parser().parse_known_args(spec["args"])
    parser = vllm_parser.make_arg_parser(FlexibleArgumentParser())
    parsed = parser.parse_args(serve.vllm_argv(args, passthrough))
    vllm_parser.validate_parsed_serve_args(parsed)
    assert parsed.port == container_port(spec, "http")
    assert parsed.host == "0.0.0.0"
    assert parsed.enable_lora
    gateway = env(container(rendered.component("Deployment", "gateway")))
    assert parsed.served_model_name == [gateway["PREFT_GATEWAY_WORKER_BASE_MODEL"]]
    # Graceful drain: preStop sleep, then vLLM drains for --shutdown-timeout, all inside
    # the grace period.
    sleep = int(spec["lifecycle"]["preStop"]["exec"]["command"][1])
    assert parsed.shutdown_timeout > 0
    assert pod_spec(workload)["terminationGracePeriodSeconds"] > sleep + parsed.shutdown_timeout


def test_schema_allows_exactly_vllms_lora_ranks(vllm_parser: Any) -> None:
    from vllm.config.lora import MaxLoRARanks

    schema = json.loads((CHART / "values.schema.json").read_text())
    ranks = schema["properties"]["worker"]["properties"]["maxLoraRank"]["enum"]
    assert ranks == list(typing.get_args(MaxLoRARanks))


def test_worker_probes_hit_vllms_endpoints(
    vllm_parser: Any, scenarios: dict[str, Rendered]
) -> None:
    """/health and /metrics as vLLM's server mounts them (the same router functions)."""
    from vllm.entrypoints.serve.instrumentator import health, metrics

    app = FastAPI()
    app.include_router(health.router)
    metrics.attach_router(app)
    app.state.engine_client = None  # vLLM's "no engine" case: healthy
    client = TestClient(app)
    spec = container(scenarios["default"].component("Deployment", "worker"))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = spec[probe]["httpGet"]
        container_port(spec, get["port"])
        assert client.get(get["path"]).status_code == 200
    assert client.get("/metrics").status_code == 200


@pytest.mark.parametrize("scenario,parser_name", [("default", None), ("gpu", "hermes")])
def test_tool_calling_is_off_by_default_and_one_value_turns_it_on(
    vllm_parser: Any,
    scenarios: dict[str, Rendered],
    values: dict[str, Any],
    scenario: str,
    parser_name: str | None,
) -> None:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    assert values["worker"]["toolCallParser"] == ""
    spec = container(scenarios[scenario].component("Deployment", "worker"))
    args, passthrough = serve.parser().parse_known_args(spec["args"])
    parsed = vllm_parser.make_arg_parser(FlexibleArgumentParser()).parse_args(
        serve.vllm_argv(args, passthrough)
    )
    assert parsed.enable_auto_tool_choice is (parser_name is not None)
    assert parsed.tool_call_parser == parser_name
