"""Values every component shares or the registry's quotas: logging.json (JSON lines from the
gateway, the registry and the workers' vLLM), tracing.* (the gateway's OpenTelemetry
settings and the workers' vLLM tracing flags, one collector) and registry.quotas (the
default per-tenant quotas). Each is set in one place; copies in a settings map are refused."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tests.chart.manifests import container, env, workloads
from tests.chart.support import SCENARIOS, Rendered

ALL = list(SCENARIOS)
COLLECTOR = "http://otel-collector.monitoring:4317"


def component_env(rendered: Rendered, component: str) -> dict[str, str]:
    return env(container(rendered.component("Deployment", component)))


def worker_args(rendered: Rendered) -> list[str]:
    return list(container(rendered.component("Deployment", "worker"))["args"])


@pytest.mark.parametrize("scenario", ALL)
def test_no_container_sets_a_variable_twice(scenarios: dict[str, Rendered], scenario: str) -> None:
    for workload in workloads(scenarios[scenario]):
        for spec in workload["spec"]["template"]["spec"]["containers"]:
            names = Counter(item["name"] for item in spec.get("env", []))
            assert [n for n, count in names.items() if count > 1] == [], spec["name"]


def test_defaults_json_logs_no_tracing_default_quotas(scenarios: dict[str, Rendered]) -> None:
    rendered = scenarios["default"]
    gateway, registry = component_env(rendered, "gateway"), component_env(rendered, "registry")
    assert gateway["PREFT_GATEWAY_LOG_JSON"] == registry["PREFT_REGISTRY_LOG_JSON"] == "true"
    assert "--log-json" in worker_args(rendered)
    assert not [name for name in gateway if "TRACING" in name or "OTLP" in name]
    assert not [arg for arg in worker_args(rendered) if "otlp" in arg]
    assert registry["PREFT_REGISTRY_TENANT_MAX_ADAPTERS"] == "1000"
    assert registry["PREFT_REGISTRY_TENANT_MAX_STORED_BYTES"] == str(10 << 30)


def test_one_logging_value_for_every_component(render: Callable[..., Rendered]) -> None:
    rendered = render([], {"logging.json": "false"})
    assert component_env(rendered, "gateway")["PREFT_GATEWAY_LOG_JSON"] == "false"
    assert component_env(rendered, "registry")["PREFT_REGISTRY_LOG_JSON"] == "false"
    assert "--log-json" not in worker_args(rendered)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_tracing_reaches_gateway_and_workers(
    render: Callable[..., Rendered], protocol: str
) -> None:
    rendered = render(
        [],
        {
            "tracing.enabled": "true",
            "tracing.otlpEndpoint": COLLECTOR,
            "tracing.protocol": protocol,
        },
    )
    gateway = component_env(rendered, "gateway")
    assert {k: v for k, v in gateway.items() if "TRACING" in k or "OTLP" in k} == {
        "PREFT_GATEWAY_TRACING_ENABLED": "true",
        "PREFT_GATEWAY_OTLP_ENDPOINT": COLLECTOR,
        "PREFT_GATEWAY_OTLP_PROTOCOL": protocol,
        "PREFT_GATEWAY_TRACING_SAMPLE_RATIO": "1",
    }
    args = worker_args(rendered)
    assert f"--otlp-traces-endpoint={COLLECTOR}" in args
    assert f"--otlp-traces-protocol={protocol}" in args


def test_platform_scenario_traces_one_request_in_ten(scenarios: dict[str, Rendered]) -> None:
    gateway = component_env(scenarios["platform"], "gateway")
    assert gateway["PREFT_GATEWAY_TRACING_SAMPLE_RATIO"] == "0.1"
    assert gateway["PREFT_GATEWAY_OTLP_PROTOCOL"] == "http/protobuf"


def test_quota_values_set_the_registry_env_exactly(render: Callable[..., Rendered]) -> None:
    big = (1 << 50) - 1  # larger than a float64 renders exactly without care
    rendered = render(
        [],
        {
            "registry.quotas.maxAdaptersPerTenant": "25",
            "registry.quotas.maxStoredBytesPerTenant": str(big),
        },
    )
    registry = component_env(rendered, "registry")
    assert registry["PREFT_REGISTRY_TENANT_MAX_ADAPTERS"] == "25"
    assert registry["PREFT_REGISTRY_TENANT_MAX_STORED_BYTES"] == str(big)


def test_platform_scenario_quotas_from_a_values_file(
    scenarios: dict[str, Rendered], values: dict[str, Any]
) -> None:
    """Through -f (YAML numbers, which templates see as floats) as well as --set."""
    registry = component_env(scenarios["platform"], "registry")
    assert registry["PREFT_REGISTRY_TENANT_MAX_ADAPTERS"] == "200"
    assert registry["PREFT_REGISTRY_TENANT_MAX_STORED_BYTES"] == str(50 << 30)
    assert values["registry"]["quotas"]["maxStoredBytesPerTenant"] == 10 << 30


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ({"tracing.enabled": "true"}, "tracing.otlpEndpoint is required when tracing.enabled=true"),
        ({"gateway.settings.LOG_JSON": "false"}, "gateway.settings.LOG_JSON: set logging.json"),
        (
            {"gateway.settings.otlp_endpoint": COLLECTOR},
            "gateway.settings.otlp_endpoint: set tracing.otlpEndpoint",
        ),
        (
            {"registry.settings.TENANT_MAX_STORED_BYTES": "5"},
            "registry.settings.TENANT_MAX_STORED_BYTES: "
            "set registry.quotas.maxStoredBytesPerTenant",
        ),
    ],
)
def test_conflicting_values_are_refused(
    render_error: Callable[..., str], sets: dict[str, str], message: str
) -> None:
    assert message in render_error([], sets)


@pytest.mark.parametrize(
    "sets",
    [
        {"tracing.protocol": "thrift"},
        {"tracing.sampleRatio": "2"},
        {"tracing.otlpEndpoint": "collector:4317"},
        {"registry.quotas.maxAdaptersPerTenant": "0"},
        {"registry.quotas.maxStoredBytesPerTenant": "10"},
    ],
)
def test_schema_refuses_bad_values(render_error: Callable[..., str], sets: dict[str, str]) -> None:
    assert "values don't meet the specifications of the schema" in render_error([], sets)
