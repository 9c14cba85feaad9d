"""Monitoring objects: every metric the dashboard and the alerts read is one the code
really exports; every expression parses (promtool); each alert fires on the condition it
describes and stays quiet otherwise (promtool rule unit tests on synthetic series); the
Prometheus Operator objects have the structure the operator expects."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client import CollectorRegistry

from preft_serve.gateway.metrics import GatewayMetrics
from preft_serve.gateway.routing import RouteResult
from preft_serve.registry.metrics import RegistryMetrics
from preft_serve.worker.adapter_tiers.disk_cache import AdapterCacheMetrics
from tests.chart.promql import exported_names, label_values, metric_names, vllm_names
from tests.chart.support import CHART, NAMESPACE, Rendered

DASHBOARD = CHART / "dashboards" / "preft-serve.json"
NS = f'namespace="{NAMESPACE}"'
ZERO_FALLBACK = " or on() vector(0)"
_COUNTER_RATE = re.compile(r"\b(?:rate|increase)\([\w:]+_total\b")


@pytest.fixture(scope="module")
def exported() -> set[str]:
    names = exported_names(GatewayMetrics().registry)
    names |= exported_names(RegistryMetrics().registry)
    names |= exported_names(AdapterCacheMetrics(CollectorRegistry()).registry)  # type: ignore[arg-type]
    spec = importlib.util.find_spec("vllm")  # the installed package's source, not imported
    assert spec is not None and spec.origin is not None
    names |= vllm_names(Path(spec.origin).parent / "v1" / "metrics" / "loggers.py")
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def counter_rate_exprs(dashboard: dict[str, Any]) -> list[str]:
    """Stat and time-series queries on counter rates. A labelled counter has no series
    before its first event, so such a query needs a fallback to show 0, not "No data".
    Ratios are left out: with no events they have no value, and 0 would claim, say, a 0 %
    hit rate."""
    return [
        t["expr"]
        for p in dashboard["panels"]
        if p["type"] in ("stat", "timeseries")
        for t in p["targets"]
        if _COUNTER_RATE.search(t["expr"]) and "/" not in t["expr"]
    ]


def _filled(expr: str) -> str:
    """A panel query with Grafana's variables filled in."""
    return expr.replace("$__rate_interval", "5m").replace("$namespace", NAMESPACE)


@pytest.fixture(scope="module")
def rule(scenarios: dict[str, Rendered]) -> dict[str, Any]:
    (found,) = scenarios["gpu"].of_kind("PrometheusRule")
    return found


def alert_rules(rule: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def test_metric_name_extraction() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le, adapter) (rate(preft_gateway_ttft_seconds_bucket"
        '{namespace=~"$namespace",adapter!="x{y}"}[$__rate_interval]))) > 2 and on (pod) '
        "max by (pod) (vllm:num_requests_waiting) offset 5m / ignoring(pod) up"
    )
    assert metric_names(expr) == {
        "preft_gateway_ttft_seconds_bucket",
        "vllm:num_requests_waiting",
        "up",
    }


def test_exported_names_cover_each_exporter(exported: set[str]) -> None:
    """The collection itself sees all four exporters (else the next checks prove little)."""
    for name in (
        "preft_gateway_requests_total",
        "preft_registry_request_seconds_bucket",
        "preft_worker_adapter_loads_total",
        "vllm:num_requests_waiting",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
    ):
        assert name in exported


def test_dashboard_reads_only_exported_metrics(
    dashboard: dict[str, Any], exported: set[str]
) -> None:
    used = set()
    for expr in dashboard_exprs(dashboard):
        names = metric_names(expr)
        assert names, expr
        assert names <= exported, f"not exported: {sorted(names - exported)} in {expr}"
        used |= names
    variables = [
        v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"
    ]
    for query in variables:
        used |= {n for n in metric_names(query.replace("label_values", "")) if n != "namespace"}
    assert used <= exported
    # What the issue asks the dashboard to show.
    for name in (
        "preft_gateway_requests_total",
        "preft_gateway_generation_tokens_total",
        "preft_gateway_ttft_seconds_bucket",
        "preft_worker_adapter_loads_total",
        "preft_gateway_routing_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_requests_waiting",
    ):
        assert name in used, name


def test_alerts_read_only_exported_metrics(rule: dict[str, Any], exported: set[str]) -> None:
    for alert in alert_rules(rule):
        names = metric_names(alert["expr"])
        assert names and names <= exported, (alert["alert"], sorted(names - exported))
        assert NS in alert["expr"]  # scoped to the release's namespace


def _source_strings(module: str, pattern: str) -> set[str]:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    found = set(re.findall(pattern, Path(spec.origin).read_text()))
    assert found, f"{pattern} matched nothing in {module}"
    return found


@pytest.fixture(scope="module")
def known_label_values() -> dict[tuple[str, str], set[str]]:
    """Values the code writes into the labels that queries match on."""
    outcomes = _source_strings(
        "preft_serve.worker.adapter_tiers.disk_cache", r'_record\(start, "(\w+)"'
    )
    states = _source_strings("preft_serve.gateway.pool_monitor", r'\.labels\("(\w+)"\)')
    return {
        ("preft_gateway_routing_total", "result"): {r.value for r in RouteResult},
        ("preft_worker_adapter_loads_total", "outcome"): outcomes,
        ("preft_worker_adapter_loads_total", "tier"): {"disk"},
        ("preft_gateway_workers", "state"): states,
        ("preft_gateway_decode_workers", "state"): states,
        ("preft_gateway_handoffs_total", "result"): _source_strings(
            "preft_serve.gateway.completion_handler", r'handoffs\.labels\("(\w+)"\)'
        ),
    }


def test_label_values_in_queries_are_ones_the_code_writes(
    dashboard: dict[str, Any],
    rule: dict[str, Any],
    known_label_values: dict[tuple[str, str], set[str]],
) -> None:
    exprs = dashboard_exprs(dashboard) + [a["expr"] for a in alert_rules(rule)]
    checked = 0
    for expr in exprs:
        for metric, label, value in label_values(expr):
            allowed = known_label_values.get((metric, label))
            if allowed is not None:
                assert value in allowed, f"{metric}{{{label}={value!r}}}: never written"
                checked += 1
    assert checked >= 10


def test_alerts_cover_the_operational_signals(rule: dict[str, Any]) -> None:
    names = {a["alert"] for a in alert_rules(rule)}
    assert {
        "PreftGatewayHighErrorRate",
        "PreftGatewayHighTTFT",
        "PreftAdapterLoadErrors",
        "PreftAdapterBlobCorrupt",
        "PreftWorkerQueueBacklog",
        "PreftWorkerKVCacheFull",
    } <= names
    docs = (CHART.parents[1] / "docs" / "deploy.md").read_text()
    for name in names:
        assert f"### {name}" in docs, f"docs/deploy.md does not explain {name}"
    for alert in alert_rules(rule):
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}
        assert alert["annotations"]["runbook_url"].endswith("#" + alert["alert"].lower())


def _promtool(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_alert_rules_pass_promtool(promtool: str, rule: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = _promtool(promtool, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules(rule))} rules found" in result.stdout


def test_dashboard_queries_parse(promtool: str, dashboard: dict[str, Any], tmp_path: Path) -> None:
    """Each panel query, with Grafana's variables filled in, as a recording rule."""
    exprs = dashboard_exprs(dashboard)
    rules = [{"record": f"dashboard:query_{i}", "expr": _filled(e)} for i, e in enumerate(exprs)]
    (tmp_path / "dashboard.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    result = _promtool(promtool, "check", "rules", "dashboard.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_counter_panels_have_a_zero_fallback(dashboard: dict[str, Any]) -> None:
    exprs = counter_rate_exprs(dashboard)
    assert len(exprs) >= 10  # the selection itself works
    missing = [e for e in exprs if not e.endswith(ZERO_FALLBACK)]
    assert not missing, f"these show No data before their first event: {missing}"


def test_counter_panels_show_zero_until_the_first_event(
    promtool: str, dashboard: dict[str, Any], tmp_path: Path
) -> None:
    """Evaluated by promtool: every counter query is 0 with no series at all, and the
    fallback leaves once a series exists (``on()`` matches any labels)."""
    zero = [{"labels": "{}", "value": 0}]
    errors = next(e for e in counter_rate_exprs(dashboard) if "preft_gateway_errors_total" in e)
    tests = [
        {
            "interval": "1m",
            "input_series": [],
            "promql_expr_test": [
                {"expr": _filled(e), "eval_time": "10m", "exp_samples": zero}
                for e in counter_rate_exprs(dashboard)
            ],
        },
        {
            "interval": "1m",
            "input_series": [
                _series("preft_gateway_errors_total", 'cause="bad_gateway"', "0+60x20")
            ],
            "promql_expr_test": [
                {
                    "expr": _filled(errors),
                    "eval_time": "10m",
                    "exp_samples": [{"labels": '{cause="bad_gateway"}', "value": 1}],
                }
            ],
        },
    ]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": []}))
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests})
    )
    result = _promtool(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{NS}{',' if labels else ''}{labels}}}", "values": values}


# alert -> (input series that must fire it, labels it fires with, series that must not,
# minutes to evaluate at). Counters grow per minute; 'AxN' repeats a gauge value.
ALERT_CASES: dict[str, tuple[list[dict[str, str]], dict[str, str], list[dict[str, str]], int]] = {
    "PreftGatewayHighErrorRate": (
        [
            _series("preft_gateway_requests_total", 'adapter="a",status="200"', "0+90x40"),
            _series("preft_gateway_requests_total", 'adapter="a",status="502"', "0+10x40"),
        ],
        {},
        [
            _series("preft_gateway_requests_total", 'adapter="a",status="200"', "0+99x40"),
            _series("preft_gateway_requests_total", 'adapter="a",status="502"', "0+1x40"),
        ],
        30,
    ),
    "PreftGatewayHighTTFT": (
        [
            _series("preft_gateway_ttft_seconds_bucket", 'adapter="a",le="1"', "0+0x40"),
            _series("preft_gateway_ttft_seconds_bucket", 'adapter="a",le="5"', "0+10x40"),
            _series("preft_gateway_ttft_seconds_bucket", 'adapter="a",le="+Inf"', "0+10x40"),
        ],
        {},
        [
            _series("preft_gateway_ttft_seconds_bucket", 'adapter="a",le="0.5"', "0+10x40"),
            _series("preft_gateway_ttft_seconds_bucket", 'adapter="a",le="+Inf"', "0+10x40"),
        ],
        30,
    ),
    "PreftNoHealthyWorkers": (
        [_series("preft_gateway_workers", 'pod="g-1",state="healthy"', "0x20")],
        {},
        [_series("preft_gateway_workers", 'pod="g-1",state="healthy"', "2x20")],
        10,
    ),
    "PreftNoHealthyDecodeWorkers": (
        [_series("preft_gateway_decode_workers", 'pod="g-1",state="healthy"', "0x20")],
        {},
        [_series("preft_gateway_decode_workers", 'pod="g-1",state="healthy"', "1x20")],
        10,
    ),
    "PreftHandoffFailures": (
        [
            _series("preft_gateway_handoffs_total", 'result="decoded"', "0+80x40"),
            _series("preft_gateway_handoffs_total", 'result="fallback"', "0+20x40"),
        ],
        {},
        [
            _series("preft_gateway_handoffs_total", 'result="decoded"', "0+99x40"),
            _series("preft_gateway_handoffs_total", 'result="first_token"', "0+20x40"),
            _series("preft_gateway_handoffs_total", 'result="decode_failed"', "0+1x40"),
        ],
        30,
    ),
    "PreftWorkerQueueBacklog": (
        [
            _series("vllm:num_requests_waiting", 'pod="w-1"', "25x40"),
            _series("vllm:num_requests_waiting", 'pod="w-2"', "0x40"),
        ],
        {"pod": "w-1"},
        [_series("vllm:num_requests_waiting", 'pod="w-1"', "3x40")],
        30,
    ),
    "PreftWorkerKVCacheFull": (
        [_series("vllm:kv_cache_usage_perc", 'pod="w-1"', "0.99x40")],
        {"pod": "w-1"},
        [_series("vllm:kv_cache_usage_perc", 'pod="w-1"', "0.6x40")],
        30,
    ),
    "PreftAdapterLoadErrors": (
        [
            _series("preft_worker_adapter_loads_total", 'tier="disk",outcome="hit"', "0+50x40"),
            _series("preft_worker_adapter_loads_total", 'tier="disk",outcome="error"', "0+10x40"),
        ],
        {},
        [
            _series("preft_worker_adapter_loads_total", 'tier="disk",outcome="hit"', "0+50x40"),
            _series(
                "preft_worker_adapter_loads_total", 'tier="disk",outcome="not_found"', "0+10x40"
            ),
        ],
        30,
    ),
    "PreftAdapterBlobCorrupt": (
        [
            _series(
                "preft_worker_adapter_loads_total",
                'tier="disk",outcome="corrupt"',
                "0 0 0 1 1 1 1 1 1 1 1",
            )
        ],
        {},
        [_series("preft_worker_adapter_loads_total", 'tier="disk",outcome="miss"', "0+5x10")],
        8,
    ),
    "PreftAdapterCacheThrashing": (
        [
            _series("preft_worker_adapter_evictions_total", 'pod="w-1",tier="disk"', "0+5x90"),
            _series(
                "preft_worker_adapter_loads_total", 'pod="w-1",tier="disk",outcome="hit"', "0+1x90"
            ),
            _series(
                "preft_worker_adapter_loads_total", 'pod="w-1",tier="disk",outcome="miss"', "0+9x90"
            ),
        ],
        {"pod": "w-1"},
        [
            _series("preft_worker_adapter_evictions_total", 'pod="w-1",tier="disk"', "0+1x90"),
            _series(
                "preft_worker_adapter_loads_total", 'pod="w-1",tier="disk",outcome="hit"', "0+9x90"
            ),
            _series(
                "preft_worker_adapter_loads_total", 'pod="w-1",tier="disk",outcome="miss"', "0+1x90"
            ),
        ],
        80,
    ),
    "PreftRoutingSpillHigh": (
        [
            _series("preft_gateway_routing_total", 'result="affinity"', "0+10x90"),
            _series("preft_gateway_routing_total", 'result="spill"', "0+30x90"),
        ],
        {},
        [
            _series("preft_gateway_routing_total", 'result="affinity"', "0+30x90"),
            _series("preft_gateway_routing_total", 'result="spill"', "0+10x90"),
        ],
        80,
    ),
    "PreftRegistryErrors": (
        [
            _series(
                "preft_registry_requests_total", 'method="PUT",route="/v1/x",status="200"', "0+5x40"
            ),
            _series(
                "preft_registry_requests_total", 'method="PUT",route="/v1/x",status="503"', "0+5x40"
            ),
        ],
        {},
        [
            _series(
                "preft_registry_requests_total",
                'method="PUT",route="/v1/x",status="200"',
                "0+50x40",
            ),
            _series(
                "preft_registry_requests_total", 'method="PUT",route="/v1/x",status="404"', "0+5x40"
            ),
        ],
        30,
    ),
    "PreftObjectStoreFull": (
        [_series("preft_registry_store_full_total", "", "0 0 0 1 1 1 1 1 1 1 1")],
        {},
        [_series("preft_registry_store_full_total", "", "0x10")],
        8,
    ),
}


def test_every_alert_has_a_unit_test(rule: dict[str, Any]) -> None:
    assert {a["alert"] for a in alert_rules(rule)} == set(ALERT_CASES)


def test_alerts_fire_on_their_condition_only(
    promtool: str, rule: dict[str, Any], tmp_path: Path
) -> None:
    """promtool's rule unit tests: each alert fires on its synthetic incident (with the
    labels it is routed by) and stays silent on a healthy variant of the same series."""
    groups = json.loads(json.dumps(rule["spec"]["groups"]))
    severities = {}
    for group in groups:
        for alert in group["rules"]:
            severities[alert["alert"]] = alert["labels"]["severity"]
            alert.pop("annotations")  # text templates are not under test here
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    tests = []
    for name, (firing, labels, healthy, minutes) in ALERT_CASES.items():
        expected = [{"exp_labels": {"severity": severities[name], **labels}}]
        for series, alerts in ((firing, expected), (healthy, [])):
            tests.append(
                {
                    "interval": "1m",
                    "input_series": series,
                    "alert_rule_test": [
                        {"eval_time": f"{minutes}m", "alertname": name, "exp_alerts": alerts}
                    ],
                }
            )
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests})
    )
    result = _promtool(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


_SELECTOR = {
    "type": "object",
    "required": ["matchLabels"],
    "additionalProperties": False,
    "properties": {
        "matchLabels": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {"type": "string"},
        }
    },
}
_ENDPOINT = {
    "type": "object",
    "required": ["port", "path"],
    "additionalProperties": False,
    "properties": {
        "port": {"type": "string"},
        "path": {"pattern": "^/"},
        "interval": {"pattern": "^[0-9]+(ms|s|m|h)$"},
    },
}
_NAMESPACES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
}
_RULE = {
    "type": "object",
    "required": ["alert", "expr", "labels", "annotations"],
    "additionalProperties": False,
    "properties": {
        "alert": {"pattern": "^[A-Za-z][A-Za-z0-9]*$"},
        "expr": {"type": "string"},
        "for": {"pattern": "^[0-9]+(s|m|h)$"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def _operator_schema(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "metadata": {"type": "object", "required": ["name", "namespace"]},
            "spec": {"type": "object", "additionalProperties": False, **spec},
        },
    }


# The fields of the monitoring.coreos.com/v1 kinds the chart uses (subset of the CRDs).
OPERATOR_SCHEMAS = {
    "ServiceMonitor": _operator_schema(
        {
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": _SELECTOR,
                "namespaceSelector": _NAMESPACES,
                "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT},
            },
        }
    ),
    "PodMonitor": _operator_schema(
        {
            "required": ["selector", "podMetricsEndpoints"],
            "properties": {
                "selector": _SELECTOR,
                "namespaceSelector": _NAMESPACES,
                "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT},
            },
        }
    ),
    "PrometheusRule": _operator_schema(
        {
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "rules": {"type": "array", "minItems": 1, "items": _RULE},
                        },
                    },
                }
            },
        }
    ),
}


@pytest.mark.parametrize("scenario", ["gpu", "ha"])
def test_operator_objects_have_the_expected_structure(
    scenarios: dict[str, Rendered], scenario: str
) -> None:
    rendered = scenarios[scenario]
    for kind, schema in OPERATOR_SCHEMAS.items():
        objects = rendered.of_kind(kind)
        assert objects, kind
        for obj in objects:
            jsonschema.validate(obj, schema)


def test_monitor_labels_let_prometheus_select_them(scenarios: dict[str, Rendered]) -> None:
    for kind in OPERATOR_SCHEMAS:
        for obj in scenarios["gpu"].of_kind(kind):
            assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_dashboard_structure(dashboard: dict[str, Any], scenarios: dict[str, Rendered]) -> None:
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
        for target in panel["targets"]:
            assert 'namespace=~"$namespace"' in target["expr"]
    # The chart ships exactly this file, labelled for the Grafana sidecar.
    config_map = scenarios["default"].component("ConfigMap", "monitoring")
    assert json.loads(config_map["data"]["preft-serve.json"]) == dashboard
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
