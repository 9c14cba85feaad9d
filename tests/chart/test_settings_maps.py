"""gateway.settings and registry.settings: every other setting, rendered as PREFT_<C>_<NAME>.
A variable the chart already sets (from another value, or fixed) is refused with the value to
change instead, and so is anything that looks like a secret: settings are plain text in the
pod spec. The names checked here are read from the rendered pods, so a variable the chart
starts setting is covered without touching this file."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.manifests import container, env
from tests.chart.support import Rendered

PREFIX = {"gateway": "PREFT_GATEWAY_", "registry": "PREFT_REGISTRY_"}
# Values that make the chart set its optional variables too.
ALL_ON = {
    "trainer.enabled": "true",
    "tracing.enabled": "true",
    "tracing.otlpEndpoint": "http://otel-collector.monitoring:4317",
    "disaggregation.enabled": "true",
    "objectStore.endpointUrl": "http://minio:9000",
    "objectStore.region": "eu-west-1",
    "objectStore.existingSecret": "s3",
    "registry.settings.MAX_UPLOAD_BYTES": "5000000",
}
RENDERS = {"default": {}, "all-on": ALL_ON, "all-on-dns": {**ALL_ON, "gateway.discovery": "dns"}}


def chart_names(rendered: Rendered, component: str, settings: set[str]) -> set[str]:
    """The component's chart-set PREFT_* names, without the prefix: its env and the data of
    the chart's ConfigMaps it loads with envFrom, less the ``settings`` the values gave."""
    spec = container(rendered.component("Deployment", component))
    names = set(env(spec))
    configmaps = {c["metadata"]["name"]: c for c in rendered.of_kind("ConfigMap")}
    for source in spec.get("envFrom", []):
        if (name := source.get("configMapRef", {}).get("name")) in configmaps:
            names |= set(configmaps[name].get("data", {}))
    prefix = PREFIX[component]
    return {n.removeprefix(prefix) for n in names if n.startswith(prefix)} - settings


@pytest.mark.parametrize("component", list(PREFIX))
@pytest.mark.parametrize("case", list(RENDERS))
def test_every_name_the_chart_sets_is_refused_with_what_to_set(
    render: Callable[..., Rendered],
    render_error: Callable[..., str],
    values: dict[str, Any],
    component: str,
    case: str,
) -> None:
    sets = RENDERS[case]
    given = set(values[component]["settings"] or {}) | {
        k.rsplit(".", 1)[1] for k in sets if k.startswith(f"{component}.settings.")
    }
    names = chart_names(render([], sets), component, given)
    assert len(names) > 10, names
    message = render_error([], {**sets, **{f"{component}.settings.{n}": "1" for n in names}})
    refused = {}
    for line in message.splitlines():
        found = re.match(rf"\s+- {component}\.settings\.(\w+): (.+)", line)
        if found:
            refused[found[1]] = found[2]
    # The one exception: the gateway's upload limit follows the registry's unless given.
    expected = names - {"MAX_UPLOAD_BYTES"} if component == "gateway" else names
    assert set(refused) == expected
    for name, todo in refused.items():
        variable = PREFIX[component] + name
        assert re.fullmatch(
            rf"set [a-zA-Z.*]+.* instead: the chart sets {variable} from it.*", todo
        ) or todo.startswith(f"remove it: the chart sets {variable} itself ("), (name, todo)


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (
            {"gateway.settings.TENANT_RPS": "50"},
            "gateway.settings.TENANT_RPS: set gateway.rateLimits.tenantRps instead",
        ),
        (
            {"gateway.settings.redis_url": "redis://elsewhere:6379/0"},
            "gateway.settings.redis_url: set redis.external.* "
            "(or redis.enabled, the bundled Redis) "
            "instead",
        ),
        (
            {"gateway.settings.TOOL_CALLING": "true"},
            "gateway.settings.TOOL_CALLING: set worker.toolCallParser instead",
        ),
        (
            {"registry.settings.FINETUNE__MAX_STEPS": "10"},
            "registry.settings.FINETUNE__MAX_STEPS: set trainer.limits.maxSteps instead",
        ),
        (
            {"registry.settings.PORT": "9000"},
            "registry.settings.PORT: remove it: the chart sets "
            "PREFT_REGISTRY_PORT itself (the container port",
        ),
    ],
)
def test_refusals_name_the_value_to_change(
    render_error: Callable[..., str], sets: dict[str, str], expected: str
) -> None:
    assert expected in render_error([], sets)


def test_the_admin_token_never_goes_into_settings(render_error: Callable[..., str]) -> None:
    message = render_error([], {"registry.settings.ADMIN_TOKEN": "s3cr3t-token-value"})
    assert (
        "registry.settings.ADMIN_TOKEN: set registry.adminToken.existingSecret instead" in message
    )
    assert "written into the pod spec in plain text" in message


@pytest.mark.parametrize("component", list(PREFIX))
@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "api_key",
        "OBJECT_STORE__S3_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "WEBHOOK_SECRET_V2",
        "GCS_CREDENTIALS",
    ],
)
def test_secret_names_are_refused(
    render_error: Callable[..., str], component: str, name: str
) -> None:
    message = render_error([], {f"{component}.settings.{name}": "hunter2hunter2"})
    prefix = PREFIX[component]
    assert (
        f"{component}.settings.{name}: settings are written into the pod spec in plain "
        f"text; put the value in a Secret and add it with {component}.extraEnv (name "
        f"{prefix}{name.upper()}, valueFrom.secretKeyRef)"
    ) in message


def test_an_ordinary_setting_renders_once(render: Callable[..., Rendered]) -> None:
    """Names that merely contain TOKEN or KEY are not secrets; each renders exactly once."""
    rendered = render(
        [],
        {
            "gateway.settings.MAX_TOKENS_CAP": "2048",
            "gateway.settings.registry_cache_entries": "500",
            "registry.settings.MAX_UPLOAD_BYTES": "5000000",
        },
    )
    for component, expected in [
        (
            "gateway",
            {
                "PREFT_GATEWAY_MAX_TOKENS_CAP": "2048",
                "PREFT_GATEWAY_REGISTRY_CACHE_ENTRIES": "500",
                "PREFT_GATEWAY_METRICS_MAX_ADAPTERS": "100",  # values.yaml's own
                "PREFT_GATEWAY_MAX_UPLOAD_BYTES": "5000000",
            },
        ),
        ("registry", {"PREFT_REGISTRY_MAX_UPLOAD_BYTES": "5000000"}),
    ]:
        items = container(rendered.component("Deployment", component))["env"]
        counts = Counter(item["name"] for item in items)
        for name, value in expected.items():
            assert counts[name] == 1, name
            assert env(container(rendered.component("Deployment", component)))[name] == value


def test_numbers_from_a_values_file_are_written_as_the_settings_read_them(
    render: Callable[..., Rendered], tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    """A values file's numbers reach the templates as floats (toString would write
    4194304 as 4.194304e+06, which the settings refuse at start-up)."""
    from preft_serve.gateway.settings import GatewaySettings
    from tests.chart.test_contract import service_env, with_secrets

    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "gateway": {"settings": {"MAX_BODY_BYTES": 4194304, "LOAD_FACTOR": 1.5}},
                "registry": {"settings": {"MAX_UPLOAD_BYTES": 2147483648}},
            }
        )
    )
    rendered = render([str(values)])
    gateway = service_env(rendered, "gateway", "PREFT_GATEWAY_")
    registry = service_env(rendered, "registry", "PREFT_REGISTRY_")
    assert gateway["PREFT_GATEWAY_MAX_BODY_BYTES"] == "4194304"
    assert gateway["PREFT_GATEWAY_LOAD_FACTOR"] == "1.5"
    assert gateway["PREFT_GATEWAY_MAX_UPLOAD_BYTES"] == "2147483648"  # the registry's
    assert registry["PREFT_REGISTRY_MAX_UPLOAD_BYTES"] == "2147483648"
    for name, value in with_secrets(gateway).items():
        clean_env.setenv(name, value)
    settings = GatewaySettings()  # type: ignore[call-arg]
    assert (settings.max_body_bytes, settings.load_factor) == (4194304, 1.5)
    assert settings.max_upload_bytes == 2147483648
