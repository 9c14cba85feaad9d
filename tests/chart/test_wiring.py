"""The rendered objects point at each other: Services select the right pods and ports, the
gateway finds the workers' Service with the RBAC it needs, every Redis client reaches the
Redis Service, registry and workers share one object store, policies and monitors select
the right pods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from tests.chart.manifests import (
    container,
    container_port,
    env,
    labels_match,
    pod_spec,
    secret_marker,
    selected_workloads,
)
from tests.chart.support import CHART, NAMESPACE, SCENARIOS, Rendered

ALL = list(SCENARIOS)


@pytest.mark.parametrize("scenario", ALL)
def test_every_service_selects_one_workload_and_a_real_port(
    scenarios: dict[str, Rendered], scenario: str
) -> None:
    rendered = scenarios[scenario]
    for service in rendered.of_kind("Service"):
        selector = service["spec"]["selector"]
        targets = selected_workloads(rendered, selector)
        assert len(targets) == 1, f"Service {service['metadata']['name']} selects {len(targets)}"
        component = service["metadata"]["labels"]["app.kubernetes.io/component"]
        assert targets[0]["metadata"]["labels"]["app.kubernetes.io/component"] == component
        for port in service["spec"]["ports"]:
            container_port(container(targets[0]), port["targetPort"])


@pytest.mark.parametrize("scenario", ALL)
def test_gateway_discovers_the_workers_headless_service(
    scenarios: dict[str, Rendered], scenario: str
) -> None:
    rendered = scenarios[scenario]
    gateway = env(container(rendered.component("Deployment", "gateway")))
    worker_service = rendered.component("Service", "worker")
    worker = rendered.component("Deployment", "worker")
    assert worker_service["spec"]["clusterIP"] == "None"
    assert labels_match(
        worker_service["spec"]["selector"], worker["spec"]["template"]["metadata"]["labels"]
    )
    # The gateway takes the port named "http" from EndpointSlices, else WORKER_PORT.
    (port,) = worker_service["spec"]["ports"]
    assert port["name"] == "http"
    assert (
        int(gateway["PREFT_GATEWAY_WORKER_PORT"])
        == port["port"]
        == container_port(container(worker), "http")
    )
    name = worker_service["metadata"]["name"]
    if gateway["PREFT_GATEWAY_DISCOVERY"] == "kubernetes":
        assert gateway["PREFT_GATEWAY_WORKER_SERVICE"] == name
        assert gateway["PREFT_GATEWAY_WORKER_K8S_NAMESPACE"] == NAMESPACE
    else:
        assert gateway["PREFT_GATEWAY_DISCOVERY"] == "dns"
        assert gateway["PREFT_GATEWAY_WORKER_DNS_NAME"] == f"{name}.{NAMESPACE}.svc.cluster.local"


def test_both_discovery_modes_are_covered() -> None:
    """At least one scenario uses dns discovery (the default is kubernetes)."""
    modes = {
        yaml.safe_load((CHART / p).read_text()).get("gateway", {}).get("discovery")
        for files in SCENARIOS.values()
        for p in files
    }
    assert "dns" in modes


@pytest.mark.parametrize("scenario", ALL)
def test_gateway_rbac_reads_endpointslices_only_for_kubernetes_discovery(
    scenarios: dict[str, Rendered], scenario: str
) -> None:
    rendered = scenarios[scenario]
    gateway = rendered.component("Deployment", "gateway")
    account = pod_spec(gateway)["serviceAccountName"]
    kubernetes = env(container(gateway))["PREFT_GATEWAY_DISCOVERY"] == "kubernetes"
    service_account = rendered.get("ServiceAccount", account)
    assert service_account["automountServiceAccountToken"] is kubernetes
    assert rendered.has("Role", "gateway") is kubernetes
    if not kubernetes:
        return
    role = rendered.component("Role", "gateway")
    assert role["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    binding = rendered.component("RoleBinding", "gateway")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]


@pytest.mark.parametrize("scenario", ALL)
def test_only_the_gateway_gets_an_api_token(scenarios: dict[str, Rendered], scenario: str) -> None:
    rendered = scenarios[scenario]
    for component in ("registry", "worker"):
        account = pod_spec(rendered.component("Deployment", component))["serviceAccountName"]
        assert rendered.get("ServiceAccount", account)["automountServiceAccountToken"] is False


def _redis_clients(rendered: Rendered) -> dict[str, str]:
    urls = {}
    for component, var in [
        ("gateway", "PREFT_GATEWAY_REDIS_URL"),
        ("registry", "PREFT_REGISTRY_REDIS_URL"),
        ("worker", "PREFT_WORKER_REGISTRY_REDIS_URL"),
    ]:
        values = env(container(rendered.component("Deployment", component)))
        if var in values:
            urls[component] = values[var]
    return urls


@pytest.mark.parametrize("scenario", ALL)
def test_redis_clients_reach_redis_with_its_password(
    scenarios: dict[str, Rendered], scenario: str
) -> None:
    rendered = scenarios[scenario]
    urls = _redis_clients(rendered)
    assert {"gateway", "registry", "worker"} <= set(urls)
    assert len(set(urls.values())) == 1, urls  # one Redis, one database, for everyone
    url = urlparse(next(iter(urls.values())))
    if rendered.has("StatefulSet", "redis"):
        service = rendered.component("Service", "redis")
        assert url.scheme == "redis"
        assert url.hostname == service["metadata"]["name"]
        assert url.port == service["spec"]["ports"][0]["port"]
        redis = env(container(rendered.component("StatefulSet", "redis")))
        # Clients send the same secret the server requires.
        assert url.password == redis["REDIS_PASSWORD"]
        assert url.password.startswith("secret.")
        args = container(rendered.component("StatefulSet", "redis"))["args"]
        assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
        assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
        assert args[args.index("--appendonly") + 1] == "yes"
    else:
        assert url.scheme == "rediss"  # ha-values: managed Redis over TLS
        assert url.hostname == "preft.abc123.cache.amazonaws.com" and url.port == 6380
        assert url.password == secret_marker("preft-redis", "password")


@pytest.mark.parametrize("scenario", ALL)
def test_registry_writes_where_workers_read(scenarios: dict[str, Rendered], scenario: str) -> None:
    rendered = scenarios[scenario]
    registry = env(container(rendered.component("Deployment", "registry")))
    worker = container(rendered.component("Deployment", "worker"))
    args = dict(a.removeprefix("--").split("=", 1) for a in worker["args"] if "=" in a)
    assert args["object-store"] == registry["PREFT_REGISTRY_OBJECT_STORE__URL"]
    assert args.get("s3-endpoint-url") == registry.get(
        "PREFT_REGISTRY_OBJECT_STORE__S3_ENDPOINT_URL"
    )
    assert env(worker).get("PREFT_WORKER_S3_REGION") == registry.get(
        "PREFT_REGISTRY_OBJECT_STORE__S3_REGION"
    )
    # Gateway, registry and workers agree on the Redis key namespace and the model name.
    gateway = env(container(rendered.component("Deployment", "gateway")))
    assert (
        gateway["PREFT_GATEWAY_NAMESPACE"]
        == registry["PREFT_REGISTRY_NAMESPACE"]
        == env(worker)["PREFT_WORKER_REGISTRY_NAMESPACE"]
    )
    assert (
        gateway["PREFT_GATEWAY_WORKER_BASE_MODEL"]
        == args["served-model-name"]
        == registry["PREFT_REGISTRY_BASE_MODEL_NAME"]
    )


@pytest.mark.parametrize("scenario", ALL)
def test_worker_model_path_lies_on_the_model_volume(
    scenarios: dict[str, Rendered], scenario: str
) -> None:
    worker = scenarios[scenario].component("Deployment", "worker")
    spec = container(worker)
    args = dict(a.removeprefix("--").split("=", 1) for a in spec["args"] if "=" in a)
    mounts = {m["name"]: m for m in spec["volumeMounts"]}
    assert args["model"].startswith(mounts["model"]["mountPath"] + "/")
    assert mounts["model"]["readOnly"] is True
    assert args["adapter-cache-dir"] == mounts["adapter-cache"]["mountPath"]
    volumes = {v["name"] for v in pod_spec(worker)["volumes"]}
    assert {m["name"] for m in spec["volumeMounts"]} <= volumes


@pytest.mark.parametrize("scenario", ALL)
def test_network_policies(scenarios: dict[str, Rendered], scenario: str) -> None:
    rendered = scenarios[scenario]
    gateway_labels = rendered.component("Deployment", "gateway")["spec"]["template"]["metadata"][
        "labels"
    ]
    registry_labels = rendered.component("Deployment", "registry")["spec"]["template"]["metadata"][
        "labels"
    ]
    worker = rendered.component("Deployment", "worker")
    worker_labels = worker["spec"]["template"]["metadata"]["labels"]

    # Both worker pools (the decode pool with disaggregation.enabled): their API from the
    # gateway (and metricsFrom) only; between the pools, all TCP (NIXL and UCX), nothing else.
    pools = {"worker": "decode-worker", "decode-worker": "worker"}
    if not rendered.has("Deployment", "decode-worker"):
        pools = {"worker": None}
    assert rendered.has("NetworkPolicy", "decode-worker") is ("decode-worker" in pools)
    for pool, other in pools.items():
        pool_labels = rendered.component("Deployment", pool)["spec"]["template"]["metadata"][
            "labels"
        ]
        policy = rendered.component("NetworkPolicy", pool)
        assert labels_match(policy["spec"]["podSelector"]["matchLabels"], pool_labels)
        rule, *handoff = policy["spec"]["ingress"]
        peers = rule["from"]
        # Every peer is narrowed (no empty peer that would admit the whole cluster).
        assert all(peer for peer in peers)
        pod_peers = [p for p in peers if "podSelector" in p and "namespaceSelector" not in p]
        assert len(pod_peers) == 1
        assert labels_match(pod_peers[0]["podSelector"]["matchLabels"], gateway_labels)
        assert not labels_match(pod_peers[0]["podSelector"]["matchLabels"], registry_labels)
        assert [p["port"] for p in rule["ports"]] == ["http"]
        if other is None:
            assert handoff == []
            continue
        (between,) = handoff
        other_labels = rendered.component("Deployment", other)["spec"]["template"]["metadata"][
            "labels"
        ]
        (peer,) = between["from"]
        assert list(peer) == ["podSelector"]
        assert labels_match(peer["podSelector"]["matchLabels"], other_labels)
        assert not labels_match(peer["podSelector"]["matchLabels"], pool_labels)
        assert not labels_match(peer["podSelector"]["matchLabels"], gateway_labels)
        assert between["ports"] == [{"protocol": "TCP"}]

    if rendered.has("StatefulSet", "redis"):
        redis_policy = rendered.component("NetworkPolicy", "redis")
        (redis_rule,) = redis_policy["spec"]["ingress"]
        allowed = [p["podSelector"]["matchLabels"] for p in redis_rule["from"]]
        for labels in (gateway_labels, registry_labels, worker_labels):
            assert any(labels_match(a, labels) for a in allowed)
        assert len(allowed) == 3
    else:
        assert not rendered.has("NetworkPolicy", "redis")


@pytest.mark.parametrize("scenario", ALL)
def test_disruption_budgets_and_autoscalers_target_real_workloads(
    scenarios: dict[str, Rendered], scenario: str
) -> None:
    rendered = scenarios[scenario]
    for pdb in rendered.of_kind("PodDisruptionBudget"):
        targets = selected_workloads(rendered, pdb["spec"]["selector"]["matchLabels"])
        assert len(targets) == 1
    for hpa in rendered.of_kind("HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        target = rendered.get(ref["kind"], ref["name"])
        assert "replicas" not in target["spec"]  # the HPA owns the replica count
        assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


@pytest.mark.parametrize("scenario", ALL)
def test_ingresses_route_to_existing_service_ports(
    scenarios: dict[str, Rendered], scenario: str
) -> None:
    rendered = scenarios[scenario]
    for ingress in rendered.of_kind("Ingress"):
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                service = rendered.get("Service", backend["name"])
                assert backend["port"]["name"] in [p["name"] for p in service["spec"]["ports"]]


def test_ingresses_expose_the_api_not_metrics_or_probes(
    render: Callable[..., Rendered],
) -> None:
    """/metrics names every tenant and adapter: Prometheus scrapes it inside the cluster."""
    rendered = render([], {"gateway.ingress.enabled": "true", "registry.ingress.enabled": "true"})
    routed = {
        ingress["metadata"]["labels"]["app.kubernetes.io/component"]: [
            path["path"] for rule in ingress["spec"]["rules"] for path in rule["http"]["paths"]
        ]
        for ingress in rendered.of_kind("Ingress")
    }
    assert routed == {"gateway": ["/v1", "/console"], "registry": ["/v1"]}
    for internal in ("/metrics", "/healthz", "/readyz"):
        assert not any(internal.startswith(p) for paths in routed.values() for p in paths)


@pytest.mark.parametrize("scenario", ["gpu", "ha"])
def test_monitors_select_the_metrics_endpoints(
    scenarios: dict[str, Rendered], scenario: str
) -> None:
    rendered = scenarios[scenario]
    monitors = rendered.of_kind("ServiceMonitor")
    assert {m["metadata"]["labels"]["app.kubernetes.io/component"] for m in monitors} == {
        "gateway",
        "registry",
    }
    for monitor in monitors:
        services = [
            s
            for s in rendered.of_kind("Service")
            if labels_match(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
        ]
        assert len(services) == 1
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics"
        assert endpoint["port"] in [p["name"] for p in services[0]["spec"]["ports"]]
        assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    (pod_monitor,) = rendered.of_kind("PodMonitor")
    (worker,) = selected_workloads(rendered, pod_monitor["spec"]["selector"]["matchLabels"])
    assert worker["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    (endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]
    container_port(container(worker), endpoint["port"])
    assert endpoint["path"] == "/metrics"


@pytest.mark.parametrize("scenario", ALL)
def test_scrape_annotations_name_the_serving_port(
    scenarios: dict[str, Rendered], scenario: str
) -> None:
    rendered = scenarios[scenario]
    for component in ("gateway", "registry", "worker"):
        workload = rendered.component("Deployment", component)
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/path"] == "/metrics"
        assert int(annotations["prometheus.io/port"]) == container_port(container(workload), "http")


def test_helm_test_pod_calls_the_services(scenarios: dict[str, Rendered]) -> None:
    rendered = scenarios["default"]
    (pod,) = [
        p
        for p in rendered.of_kind("Pod")
        if p["metadata"]["annotations"].get("helm.sh/hook") == "test"
    ]
    urls = [urlparse(a) for a in pod["spec"]["containers"][0]["command"] if "://" in a]
    assert {u.path for u in urls} == {"/readyz"}
    components = set()
    for url in urls:
        service = rendered.get("Service", url.hostname)
        assert url.port == service["spec"]["ports"][0]["port"]
        components.add(service["metadata"]["labels"]["app.kubernetes.io/component"])
    assert components == {"gateway", "registry"}


def test_scaling_workers_is_one_value(render: Callable[..., Rendered]) -> None:
    rendered = render([], {"worker.replicas": "7"})
    assert rendered.component("Deployment", "worker")["spec"]["replicas"] == 7
    autoscaled = render(["ci/ha-values.yaml"])
    hpa = autoscaled.component("HorizontalPodAutoscaler", "worker")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "vllm_num_requests_waiting"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (4, 16)


@pytest.mark.parametrize("scenario", ALL)
def test_gateway_forwards_files_and_fine_tuning_to_the_registry_service(
    scenarios: dict[str, Rendered], scenario: str
) -> None:
    rendered = scenarios[scenario]
    gateway = env(container(rendered.component("Deployment", "gateway")))
    url = urlparse(gateway["PREFT_GATEWAY_REGISTRY_URL"])
    service = rendered.component("Service", "registry")
    assert url.scheme == "http"
    assert url.hostname == f"{service['metadata']['name']}.{NAMESPACE}.svc"
    assert url.port == service["spec"]["ports"][0]["port"]


def test_a_restricted_registry_still_admits_the_gateway_and_uploads_share_its_limit(
    render: Callable[..., Rendered], values: dict[str, Any]
) -> None:
    rendered = render(
        [],
        {
            "registry.networkPolicy.ingressFrom[0].namespaceSelector.matchLabels.team": "ml",
            "registry.settings.MAX_UPLOAD_BYTES": "5000000",
        },
    )
    gateway_labels = rendered.component("Deployment", "gateway")["spec"]["template"]["metadata"][
        "labels"
    ]
    (rule,) = rendered.component("NetworkPolicy", "registry")["spec"]["ingress"]
    assert rule["from"][0] == {"namespaceSelector": {"matchLabels": {"team": "ml"}}}
    gateway_peer, prometheus, test_pod = rule["from"][1:]
    assert list(gateway_peer) == ["podSelector"]
    assert labels_match(gateway_peer["podSelector"]["matchLabels"], gateway_labels)
    # Prometheus still scrapes /metrics, and `helm test` still reaches /readyz.
    assert prometheus == values["networkPolicy"]["metricsFrom"][0]
    test_labels = rendered.component("Pod", "test")["metadata"]["labels"]
    assert labels_match(test_pod["podSelector"]["matchLabels"], test_labels)
    gateway = env(container(rendered.component("Deployment", "gateway")))
    assert gateway["PREFT_GATEWAY_MAX_UPLOAD_BYTES"] == "5000000"
    # Open to everyone by default: no peer list at all, and no upload limit to copy.
    default = render([])
    (open_rule,) = default.component("NetworkPolicy", "registry")["spec"]["ingress"]
    assert "from" not in open_rule
    assert "PREFT_GATEWAY_MAX_UPLOAD_BYTES" not in env(
        container(default.component("Deployment", "gateway"))
    )


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        ({}, False),
        ({"worker.toolCallParser": "hermes"}, True),
        ({"worker.toolCallParser": "llama3_json", "disaggregation.enabled": "true"}, True),
    ],
)
def test_the_gateway_allows_tools_exactly_when_the_workers_parse_them(
    render: Callable[..., Rendered],
    clean_env: pytest.MonkeyPatch,
    sets: dict[str, str],
    expected: bool,
) -> None:
    """One value, worker.toolCallParser, gives the workers their parser and tells the
    gateway, whose /v1/responses otherwise refuses requests with tools."""
    from preft_serve.gateway.settings import GatewaySettings

    rendered = render([], sets)
    args = container(rendered.component("Deployment", "worker"))["args"]
    assert ("--enable-auto-tool-choice" in args) is expected
    for name, value in env(container(rendered.component("Deployment", "gateway"))).items():
        if name.startswith("PREFT_GATEWAY_"):
            clean_env.setenv(name, value)
    assert GatewaySettings().tool_calling is expected
