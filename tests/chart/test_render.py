"""`helm lint` and `helm template` for every values scenario; every rendered manifest is
checked against the Kubernetes OpenAPI schemas offline (strict: unknown fields fail).

The Prometheus Operator kinds are not in those schemas; they are the only kinds skipped
here, and tests/chart/test_monitoring.py checks their structure and their PromQL instead.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import redis

from preft_serve.onebox.processes import free_port
from tests.chart.manifests import container
from tests.chart.support import CHART, SCENARIOS, Rendered, run_helm

# Oldest supported (Chart.yaml kubeVersion) and the newest the validator knows.
KUBE_VERSIONS = ["1.29", kubernetes_validate.latest_version()]
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_helm_lint(helm: str, scenario: str) -> None:
    args = ["lint", str(CHART), "--strict", "--namespace", "llm"]
    for path in SCENARIOS[scenario]:
        args += ["-f", str(CHART / path)]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_manifests_match_kubernetes_schemas(
    scenarios: dict[str, Rendered], scenario: str, version: str
) -> None:
    problems = []
    checked = 0
    for doc in scenarios[scenario].docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
            checked += 1
        except kubernetes_validate.ValidationError as exc:
            problems.append(
                f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} "
                f"at {'/'.join(map(str, exc.path))}"
            )
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(exc.message)
    assert not problems, "\n".join(problems)
    assert checked >= 20  # the core of the chart, not an empty render


def test_only_operator_kinds_are_exempt(scenarios: dict[str, Rendered]) -> None:
    """The schema check skips nothing but the three Prometheus Operator kinds."""
    kinds = {(d["apiVersion"], d["kind"]) for r in scenarios.values() for d in r.docs}
    exempt = {k for k in kinds if k[0].split("/")[0].endswith("coreos.com")}
    assert exempt == CRD_KINDS


def test_default_install_renders_every_component(scenarios: dict[str, Rendered]) -> None:
    default = scenarios["default"]
    for kind, component in [
        ("Deployment", "gateway"),
        ("Deployment", "registry"),
        ("Deployment", "worker"),
        ("StatefulSet", "redis"),
        ("HorizontalPodAutoscaler", "gateway"),
        ("PodDisruptionBudget", "gateway"),
        ("PodDisruptionBudget", "worker"),
        ("Role", "gateway"),
        ("RoleBinding", "gateway"),
        ("NetworkPolicy", "worker"),
        ("NetworkPolicy", "redis"),
        ("ConfigMap", "monitoring"),
    ]:
        assert default.has(kind, component), f"{kind} for {component} missing"
    # Operator objects are opt-in: a cluster without the CRDs must install the defaults.
    assert not [d for d in default.docs if d["apiVersion"].startswith("monitoring.coreos.com")]


def test_every_resource_carries_the_standard_labels(scenarios: dict[str, Rendered]) -> None:
    for name, rendered in scenarios.items():
        for doc in rendered.docs:
            labels: dict[str, Any] = doc["metadata"]["labels"]
            assert labels["app.kubernetes.io/instance"] == "prod", (name, doc["kind"])
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["app.kubernetes.io/name"] == "preft-serve"
            assert labels["helm.sh/chart"].startswith("preft-serve-")
            assert doc["metadata"]["namespace"] == "llm"


def test_resource_names_are_unique_per_kind(scenarios: dict[str, Rendered]) -> None:
    for rendered in scenarios.values():
        keys = [(d["kind"], d["metadata"]["name"]) for d in rendered.docs]
        assert len(keys) == len(set(keys))


# Switches no CI values file flips, rendered on top of the defaults and schema-checked too.
VARIANTS = {
    "redis-without-persistence": {"redis.persistence.enabled": "false"},
    "no-network-policies": {"networkPolicy.enabled": "false"},
    "nodeport-gateway": {"gateway.service.type": "NodePort", "gateway.service.nodePort": "30080"},
    "no-pdbs-no-hpa": {
        "gateway.pdb.enabled": "false",
        "worker.pdb.enabled": "false",
        "gateway.autoscaling.enabled": "false",
    },
    "own-service-accounts": {
        "gateway.serviceAccount.create": "false",
        "gateway.serviceAccount.name": "gw",
        "gateway.rbac.create": "false",
        "worker.serviceAccount.create": "false",
        "registry.serviceAccount.create": "false",
    },
    "everything-on": {
        "metrics.serviceMonitor.enabled": "true",
        "metrics.prometheusRule.enabled": "true",
        "worker.autoscaling.enabled": "true",
        "registry.replicas": "3",
        "gateway.ingress.enabled": "true",
        "registry.ingress.enabled": "true",
        "image.pullSecrets[0]": "regcred",
        "worker.gpu.count": "2",
        "worker.extraArgs[0]": "--tensor-parallel-size=2",
    },
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variants_render_valid_manifests(render: Callable[..., Rendered], variant: str) -> None:
    rendered = render([], VARIANTS[variant])
    for doc in rendered.docs:
        if (doc["apiVersion"], doc["kind"]) not in CRD_KINDS:
            kubernetes_validate.validate(doc, KUBE_VERSIONS[-1], strict=True)
    if variant == "redis-without-persistence":
        redis = rendered.component("StatefulSet", "redis")
        assert "volumeClaimTemplates" not in redis["spec"]
        assert {"name": "data", "emptyDir": {}} in redis["spec"]["template"]["spec"]["volumes"]
    if variant == "own-service-accounts":
        assert rendered.of_kind("ServiceAccount") == [] and rendered.of_kind("Role") == []
        gateway = rendered.component("Deployment", "gateway")
        assert gateway["spec"]["template"]["spec"]["serviceAccountName"] == "gw"
    if variant == "everything-on":
        worker = rendered.component("Deployment", "worker")["spec"]["template"]["spec"]
        assert worker["imagePullSecrets"] == [{"name": "regcred"}]
        assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
        assert rendered.has("PodDisruptionBudget", "registry")


def test_the_bundled_redis_bounds_its_memory_below_the_container_limit(
    scenarios: dict[str, Rendered], tmp_path: Path
) -> None:
    """redis-server run with the chart's own arguments refuses writes past --maxmemory
    (noeviction) instead of growing into the container's OOM kill."""
    spec = container(scenarios["default"].component("StatefulSet", "redis"), "redis")
    args = list(spec["args"])
    args[args.index("--dir") + 1] = str(tmp_path)
    port = free_port()
    args[args.index("--port") + 1] = str(port)
    args = [a.replace("$(REDIS_PASSWORD)", "pw") for a in args]
    limit = spec["resources"]["limits"]["memory"]
    assert limit == "2Gi"
    server = subprocess.Popen([*spec["command"], *args], stdout=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port, password="pw")
        deadline = time.monotonic() + 10
        while True:
            try:
                config = client.config_get("maxmemory*")
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        assert config["maxmemory-policy"] == "noeviction"
        assert 0 < int(config["maxmemory"]) <= 0.8 * 2 * 1024**3
    finally:
        server.terminate()
        server.wait(10)
