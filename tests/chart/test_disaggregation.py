"""Prefill and decode pools (disaggregation.enabled): off, the chart renders what it always did;
on, the workers prefill with adapters (--role prefill) and hand prompt KV over NIXL to a decode
pool of its own (--role decode, the base model only) that the gateway discovers, the
Services, autoscaler, budget, policies and monitors keep apart, and the launcher and vLLM
accept."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import kubernetes_validate
import pytest

from preft_serve.gateway.settings import GatewaySettings
from preft_serve.worker import serve
from tests.chart.manifests import (
    container,
    container_port,
    env,
    field_marker,
    labels_match,
    pod_spec,
    selected_workloads,
)
from tests.chart.support import NAMESPACE, SCENARIOS, Rendered

ON = {"disaggregation.enabled": "true"}
POOL_FLAGS = ("--role", "--kv-host", "--kv-port", "--kv-lease-s")
# What only a worker with adapters gets: LoRA slots, the object store and its cache, Redis.
ADAPTER_FLAGS = (
    "--max-loras",
    "--max-cpu-loras",
    "--max-lora-rank",
    "--object-store",
    "--s3-endpoint-url",
    "--adapter-dir",
    "--adapter-cache-dir",
    "--adapter-cache-gib",
    "--registry-redis-url",
    "--enable-lora",
)
OFF_SCENARIOS = [name for name in SCENARIOS if name != "disaggregated"]


def flags(spec: dict[str, Any]) -> dict[str, str]:
    """``--name=value`` arguments as name -> value (bare flags map to "")."""
    out = {}
    for arg in spec["args"]:
        name, _, value = arg.partition("=")
        out[name] = value
    return out


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


@pytest.fixture(scope="module")
def on(render: Callable[..., Rendered]) -> Rendered:
    """The defaults with the pools on (kubernetes discovery, GPU workers)."""
    return render([], ON)


@pytest.fixture(scope="module")
def on_dns(render: Callable[..., Rendered]) -> Rendered:
    return render(["ci/external-s3-values.yaml"], ON)


# --- Off (the default): nothing changes -------------------------------------------------


@pytest.mark.parametrize("scenario", OFF_SCENARIOS)
def test_off_renders_no_decode_pool_and_unified_workers(
    scenarios: dict[str, Rendered], scenario: str
) -> None:
    rendered = scenarios[scenario]
    decode = [
        d
        for d in rendered.docs
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "decode-worker"
    ]
    assert decode == []
    spec = container(rendered.component("Deployment", "worker"))
    assert not [a for a in spec["args"] if a.split("=")[0] in POOL_FLAGS]
    assert serve.parser().parse_known_args(spec["args"])[0].role == "unified"
    assert [p["name"] for p in spec["ports"]] == ["http"]
    assert "POD_IP" not in env(spec)
    gateway = env(container(rendered.component("Deployment", "gateway")))
    assert not [name for name in gateway if "DECODE" in name]
    assert len(rendered.component("NetworkPolicy", "worker")["spec"]["ingress"]) == 1


def test_the_disaggregated_scenario_turns_it_on(scenarios: dict[str, Rendered]) -> None:
    rendered = scenarios["disaggregated"]
    assert rendered.has("Deployment", "decode-worker")
    assert rendered.has("HorizontalPodAutoscaler", "decode-worker")
    assert rendered.has("PodMonitor", "decode-worker")


# --- On: the two pools ------------------------------------------------------------------


def test_workers_prefill_with_their_adapters_and_a_nixl_side_channel(
    on: Rendered, values: dict[str, Any]
) -> None:
    workload = on.component("Deployment", "worker")
    spec = container(workload, "worker")
    args = flags(spec)
    assert args["--role"] == "prefill"
    assert args["--kv-host"] == "$(POD_IP)"
    assert int(args["--kv-port"]) == values["disaggregation"]["kvPort"] == 5600
    assert int(args["--kv-lease-s"]) == values["disaggregation"]["kvLeaseSeconds"] == 30
    # The pod IP from the downward API; the kubelet expands $(POD_IP) in args.
    (pod_ip,) = [e for e in spec["env"] if e["name"] == "POD_IP"]
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert container_port(spec, "nixl") == 5600
    assert {"name": "nixl", "containerPort": 5600, "protocol": "TCP"} in spec["ports"]
    # Adapters as before: the object store, its cache, LoRA slots, Redis for hot swaps.
    for flag in ("--object-store", "--adapter-cache-dir", "--max-loras", "--max-lora-rank"):
        assert flag in args
    assert "PREFT_WORKER_REGISTRY_REDIS_URL" in env(spec)


def test_decode_workers_run_the_base_model_without_adapters(on: Rendered) -> None:
    workload = on.component("Deployment", "decode-worker")
    spec = container(workload, "decode-worker")
    assert spec["command"] == ["python3", "-m", "preft_serve.worker.serve"]
    args = flags(spec)
    assert args["--role"] == "decode"
    assert args["--kv-host"] == "$(POD_IP)" and args["--kv-port"] == "5600"
    assert "--kv-lease-s" not in args  # the prefill side's lease
    assert not [f for f in ADAPTER_FLAGS if f in args]
    assert not [a for a in spec["args"] if "lora" in a]
    # No adapter settings, object store credentials or Redis in the environment.
    variables = env(spec)
    assert variables["POD_IP"] == field_marker("status.podIP")
    assert not [
        name
        for name in variables
        if name.startswith(("PREFT_", "AWS_")) or name == "REDIS_PASSWORD"
    ]
    assert "envFrom" not in spec
    assert container_port(spec, "nixl") == 5600
    # No adapter cache; the same model, mounted read-only.
    volumes = {v["name"] for v in pod_spec(workload)["volumes"]}
    assert "adapter-cache" not in volumes and "model" in volumes
    assert "adapter-cache" not in {m["name"] for m in spec["volumeMounts"]}
    worker = container(on.component("Deployment", "worker"))
    assert args["--model"] == flags(worker)["--model"]
    assert args["--served-model-name"] == flags(worker)["--served-model-name"]
    assert args["--port"] == flags(worker)["--port"]


def test_decode_pods_are_worker_pods_without_adapters(on: Rendered) -> None:
    """The same image, probes, security, drain and GPU as the workers; their own name,
    service account and replica count."""
    worker = on.component("Deployment", "worker")
    decode = on.component("Deployment", "decode-worker")
    w, d = container(worker), container(decode)
    for key in (
        "image",
        "imagePullPolicy",
        "startupProbe",
        "readinessProbe",
        "livenessProbe",
        "lifecycle",
        "securityContext",
    ):
        assert d[key] == w[key], key
    assert d["resources"]["limits"] == w["resources"]["limits"]
    assert d["resources"]["limits"]["nvidia.com/gpu"] == 1
    # A decode worker holds no adapters, so it asks for less memory than the host slots need.
    assert (d["resources"]["requests"]["memory"], w["resources"]["requests"]["memory"]) == (
        "32Gi",
        "48Gi",
    )
    for key in ("securityContext", "terminationGracePeriodSeconds", "tolerations"):
        assert pod_spec(decode)[key] == pod_spec(worker)[key], key
    assert decode["spec"]["strategy"] == worker["spec"]["strategy"]
    assert decode["spec"]["replicas"] == 2
    assert pod_spec(decode)["serviceAccountName"] == "prod-preft-serve-decode-worker"
    annotations = decode["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == container_port(d, "http")


def test_decode_pool_values_are_its_own(render: Callable[..., Rendered]) -> None:
    rendered = render(
        [],
        {
            **ON,
            "decodeWorker.replicas": "5",
            "decodeWorker.resources.requests.memory": "16Gi",
            "decodeWorker.nodeSelector.pool": "decode",
            "decodeWorker.extraArgs[0]": "--max-model-len=8192",
            "decodeWorker.extraEnv[0].name": "VLLM_LOGGING_LEVEL",
            "decodeWorker.extraEnv[0].value": "DEBUG",
            "decodeWorker.podLabels.tier": "decode",
            "worker.extraArgs[0]": "--enable-prefix-caching",
        },
    )
    decode = rendered.component("Deployment", "decode-worker")
    spec = container(decode)
    assert decode["spec"]["replicas"] == 5
    assert spec["resources"]["requests"]["memory"] == "16Gi"
    assert pod_spec(decode)["nodeSelector"] == {"pool": "decode"}
    assert "--max-model-len=8192" in spec["args"]
    # worker.extraArgs are the workers' alone (a decode worker never caches prefixes).
    assert "--enable-prefix-caching" not in spec["args"]
    assert (
        "--enable-prefix-caching" in container(rendered.component("Deployment", "worker"))["args"]
    )
    assert env(spec)["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert pod_labels(decode)["tier"] == "decode"
    worker = rendered.component("Deployment", "worker")
    assert "tier" not in pod_labels(worker) and "nodeSelector" not in pod_spec(worker)
    assert rendered.component("Deployment", "worker")["spec"]["replicas"] == 2


def test_cpu_and_model_download_pools(render: Callable[..., Rendered]) -> None:
    cpu = render(["ci/cpu-values.yaml"], ON)
    spec = container(cpu.component("Deployment", "decode-worker"))
    assert "--device=cpu" in spec["args"] and "--kv-cache-gib=4" in spec["args"]
    assert "nvidia.com/gpu" not in spec["resources"].get("limits", {})
    assert "tolerations" not in pod_spec(cpu.component("Deployment", "decode-worker"))
    download = render(["ci/model-download-values.yaml"], ON)
    for component in ("worker", "decode-worker"):
        init = pod_spec(download.component("Deployment", component))["initContainers"]
        assert [c["name"] for c in init] == ["model-download"]
    worker = pod_spec(download.component("Deployment", "worker"))["initContainers"][0]
    decode = pod_spec(download.component("Deployment", "decode-worker"))["initContainers"][0]
    assert decode == worker


# --- The gateway finds the decode pool ----------------------------------------------------


@pytest.mark.parametrize("discovery", ["kubernetes", "dns"])
def test_gateway_discovers_the_decode_pool(
    on: Rendered, on_dns: Rendered, discovery: str, clean_env: pytest.MonkeyPatch
) -> None:
    rendered = on if discovery == "kubernetes" else on_dns
    gateway = env(container(rendered.component("Deployment", "gateway")))
    assert gateway["PREFT_GATEWAY_DISCOVERY"] == discovery
    service = rendered.component("Service", "decode-worker")
    name = service["metadata"]["name"]
    decode_vars = {k: v for k, v in gateway.items() if "DECODE" in k}
    if discovery == "kubernetes":
        assert decode_vars == {"PREFT_GATEWAY_DECODE_WORKER_SERVICE": name}
        assert gateway["PREFT_GATEWAY_WORKER_K8S_NAMESPACE"] == NAMESPACE
    else:
        assert decode_vars == {
            "PREFT_GATEWAY_DECODE_WORKER_DNS_NAME": f"{name}.{NAMESPACE}.svc.cluster.local"
        }
    # One port for both pools: the decode Service's "http" is the workers' port.
    (port,) = service["spec"]["ports"]
    assert port["name"] == "http"
    assert (
        int(gateway["PREFT_GATEWAY_WORKER_PORT"])
        == port["port"]
        == container_port(container(rendered.component("Deployment", "decode-worker")), "http")
    )
    # The gateway's own settings read them and see a decode pool.
    for variable, value in gateway.items():
        if variable.startswith("PREFT_GATEWAY_"):
            clean_env.setenv(variable, value.replace("secret.", "s"))
    settings = GatewaySettings()
    assert settings.has_decode_pool


def test_gateway_rbac_covers_the_decode_service(on: Rendered) -> None:
    """The gateway lists EndpointSlices namespace-wide (by service-name label), so its Role,
    not narrowed to resource names, covers the decode Service in the same namespace."""
    role = on.component("Role", "gateway")
    assert (
        role["metadata"]["namespace"]
        == on.component("Service", "decode-worker")["metadata"]["namespace"]
        == NAMESPACE
    )
    (rule,) = role["rules"]
    assert rule["resources"] == ["endpointslices"] and "resourceNames" not in rule
    assert {"list", "watch"} <= set(rule["verbs"])


def test_services_keep_the_pools_apart(on: Rendered) -> None:
    worker = on.component("Deployment", "worker")
    decode = on.component("Deployment", "decode-worker")
    decode_service = on.component("Service", "decode-worker")
    worker_service = on.component("Service", "worker")
    assert decode_service["spec"]["clusterIP"] == "None"
    assert decode_service["spec"]["publishNotReadyAddresses"] is False
    assert selected_workloads(on, decode_service["spec"]["selector"]) == [decode]
    assert selected_workloads(on, worker_service["spec"]["selector"]) == [worker]
    assert not labels_match(worker_service["spec"]["selector"], pod_labels(decode))
    assert not labels_match(decode_service["spec"]["selector"], pod_labels(worker))
    # Deployment selectors too (a Deployment adopting the other pool's pods would fight it).
    assert not labels_match(worker["spec"]["selector"]["matchLabels"], pod_labels(decode))
    assert not labels_match(decode["spec"]["selector"]["matchLabels"], pod_labels(worker))


# --- Scaling, disruption, accounts, policies, monitoring ---------------------------------


def test_decode_autoscaler_targets_the_decode_pool_on_queue_and_kv_cache(
    scenarios: dict[str, Rendered], render: Callable[..., Rendered]
) -> None:
    rendered = scenarios["disaggregated"]
    hpa = rendered.component("HorizontalPodAutoscaler", "decode-worker")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", "prod-preft-serve-decode-worker")
    assert (
        rendered.get("Deployment", ref["name"])["metadata"]["labels"]["app.kubernetes.io/component"]
        == "decode-worker"
    )
    assert "replicas" not in rendered.get("Deployment", ref["name"])["spec"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 12)
    metrics = {m["pods"]["metric"]["name"]: m["pods"]["target"] for m in hpa["spec"]["metrics"]}
    assert metrics == {
        "vllm_num_requests_waiting": {"type": "AverageValue", "averageValue": "4"},
        "vllm_kv_cache_usage_perc": {"type": "AverageValue", "averageValue": "0.8"},
    }
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 600
    # The workers keep their own autoscaler on their own Deployment.
    worker_hpa = rendered.component("HorizontalPodAutoscaler", "worker")
    assert worker_hpa["spec"]["scaleTargetRef"]["name"] == "prod-preft-serve-worker"
    # Queue alone; and no autoscaler when it is off.
    queue_only = render(
        [],
        {
            **ON,
            "decodeWorker.autoscaling.enabled": "true",
            "decodeWorker.autoscaling.kvCacheMetricName": "",
        },
    )
    (metric,) = queue_only.component("HorizontalPodAutoscaler", "decode-worker")["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "vllm_num_requests_waiting"
    kubernetes_validate.validate(
        queue_only.component("HorizontalPodAutoscaler", "decode-worker"), "1.29", strict=True
    )


def test_decode_budget_and_account(on: Rendered, render: Callable[..., Rendered]) -> None:
    pdb = on.component("PodDisruptionBudget", "decode-worker")
    assert pdb["spec"]["maxUnavailable"] == 1
    (target,) = selected_workloads(on, pdb["spec"]["selector"]["matchLabels"])
    assert target["metadata"]["labels"]["app.kubernetes.io/component"] == "decode-worker"
    # Its own account: no API token, and no object store role (IRSA) even when the workers
    # have one: decode workers read no adapters.
    ha = render(["ci/ha-values.yaml"], ON)
    account = ha.get(
        "ServiceAccount",
        pod_spec(ha.component("Deployment", "decode-worker"))["serviceAccountName"],
    )
    assert account["automountServiceAccountToken"] is False
    assert "annotations" not in account["metadata"]
    worker_account = ha.get(
        "ServiceAccount", pod_spec(ha.component("Deployment", "worker"))["serviceAccountName"]
    )
    assert "eks.amazonaws.com/role-arn" in worker_account["metadata"]["annotations"]
    no_pdb = render([], {**ON, "decodeWorker.pdb.enabled": "false"})
    assert not no_pdb.has("PodDisruptionBudget", "decode-worker")
    assert no_pdb.has("PodDisruptionBudget", "worker")


def test_decode_workers_are_scraped(scenarios: dict[str, Rendered]) -> None:
    rendered = scenarios["disaggregated"]
    monitors = {
        m["metadata"]["labels"]["app.kubernetes.io/component"]: m
        for m in rendered.of_kind("PodMonitor")
    }
    assert set(monitors) == {"worker", "decode-worker"}
    for component, monitor in monitors.items():
        (workload,) = selected_workloads(rendered, monitor["spec"]["selector"]["matchLabels"])
        assert workload["metadata"]["labels"]["app.kubernetes.io/component"] == component
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        container_port(container(workload), endpoint["port"])
        assert endpoint["path"] == "/metrics"


def test_network_policies_open_only_the_pools_to_each_other(on: Rendered) -> None:
    """The KV hand-off (NIXL side channel and UCX transfers, ports chosen at run time) needs
    TCP between the pools; nothing else reaches either pool beyond the gateway and scrapes."""
    for pool, other in (("worker", "decode-worker"), ("decode-worker", "worker")):
        policy = on.component("NetworkPolicy", pool)
        api, between = policy["spec"]["ingress"]
        assert [p["port"] for p in api["ports"]] == ["http"]
        (peer,) = between["from"]
        assert labels_match(
            peer["podSelector"]["matchLabels"], pod_labels(on.component("Deployment", other))
        )
        assert between["ports"] == [{"protocol": "TCP"}]


# --- The launcher and vLLM accept both pools' command lines ------------------------------


@pytest.mark.parametrize("component", ["worker", "decode-worker"])
def test_launcher_accepts_both_pools(on: Rendered, component: str) -> None:
    spec = container(on.component("Deployment", component))
    args, passthrough = serve.parser().parse_known_args(spec["args"])
    # The pool flags the chart passes are the launcher's own (vLLM would refuse them).
    assert not [a for a in passthrough if a.split("=")[0] in POOL_FLAGS]
    assert args.role == {"worker": "prefill", "decode-worker": "decode"}[component]
    assert args.kv_port == container_port(spec, "nixl")
    # The launcher's own checks (a decode worker refuses adapter flags) pass.
    argv = serve.vllm_argv(args, passthrough)
    transfer = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert (
        transfer["kv_role"] == {"worker": "kv_producer", "decode-worker": "kv_consumer"}[component]
    )
    # NIXL's side channel on the pod IP, as the kubelet expands $(POD_IP) (here to an
    # address of this host, which the launcher looks up to bind UCX to its interface).
    pod_env = env(spec)
    assert args.kv_host == "$(POD_IP)"
    args.kv_host = "127.0.0.1"
    side_channel = serve.pool_env(args)
    assert side_channel["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert side_channel["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert pod_env["POD_IP"] == field_marker("status.podIP")
    if component == "worker":
        assert transfer["kv_connector_extra_config"] == {"kv_lease_duration": 30}
        assert "--enable-lora" in argv
    else:
        assert "--enable-lora" not in argv and "--no-enable-prefix-caching" in argv


@pytest.fixture(scope="module")
def vllm_parser() -> Any:
    return pytest.importorskip("vllm.entrypoints.launchers.cli_args")


@pytest.mark.parametrize("component", ["worker", "decode-worker"])
def test_vllm_accepts_both_pools(
    vllm_parser: Any, scenarios: dict[str, Rendered], component: str
) -> None:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    rendered = scenarios["disaggregated"]
    spec = container(rendered.component("Deployment", component))
    args, passthrough = serve.parser().parse_known_args(spec["args"])
    parsed = vllm_parser.make_arg_parser(FlexibleArgumentParser()).parse_args(
        serve.vllm_argv(args, passthrough)
    )
    vllm_parser.validate_parsed_serve_args(parsed)
    assert bool(parsed.enable_lora) is (component == "worker")
    assert parsed.max_model_len == 8192  # both pools: decodeWorker.extraArgs repeat it
    assert parsed.kv_transfer_config is not None
    if component == "decode-worker":
        assert parsed.enable_prefix_caching is False


# --- Values the chart refuses -------------------------------------------------------------


def test_refuses_pools_that_cannot_work(render_error: Callable[..., str]) -> None:
    message = render_error(
        [],
        {
            **ON,
            "decodeWorker.replicas": "0",
            "disaggregation.kvPort": "8000",
            "decodeWorker.extraArgs[0]": "--enable-prefix-caching",
            "worker.extraArgs[0]": "--role=prefill",
            "gateway.settings.DECODE_WORKER_SERVICE": "elsewhere",
        },
    )
    assert "Invalid values for the preft-serve chart" in message
    for expected in [
        "decodeWorker.replicas (0) must be at least 1 when disaggregation.enabled=true",
        "disaggregation.kvPort (8000) must differ from worker.port (8000)",
        "decodeWorker.extraArgs: remove --enable-prefix-caching",
        "worker.extraArgs: remove --role; set disaggregation.enabled",
        "gateway.settings.DECODE_WORKER_SERVICE: set disaggregation.enabled instead",
    ]:
        assert expected in message
    bounds = render_error(
        [],
        {
            **ON,
            "decodeWorker.autoscaling.enabled": "true",
            "decodeWorker.autoscaling.minReplicas": "6",
            "decodeWorker.autoscaling.maxReplicas": "3",
        },
    )
    assert "decodeWorker.autoscaling.minReplicas (6) must not exceed maxReplicas (3)" in bounds
    # The pool flags are the chart's even with the pools off.
    off = render_error([], {"worker.extraArgs[0]": "--kv-port=5700"})
    assert "worker.extraArgs: remove --kv-port" in off


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        ({"disaggregation.kvPort": "80"}, "/disaggregation/kvPort"),
        ({"disaggregation.kvLeaseSeconds": "0"}, "/disaggregation/kvLeaseSeconds"),
        ({"decodeWorker.replica": "3"}, "additional properties 'replica' not allowed"),
        ({"decodeWorker.autoscaling.metricName": ""}, "/decodeWorker/autoscaling/metricName"),
    ],
)
def test_schema_refuses(
    render_error: Callable[..., str], sets: dict[str, str], expected: str
) -> None:
    message = render_error([], sets)
    assert "values don't meet the specifications of the schema" in message
    assert expected in message


def test_fixing_the_values_renders(render: Callable[..., Rendered]) -> None:
    """Zero static decode replicas is fine once the autoscaler owns the count, and a user's
    own --kv-transfer-config (another connector) is theirs while the pools are off."""
    rendered = render(
        [], {**ON, "decodeWorker.replicas": "0", "decodeWorker.autoscaling.enabled": "true"}
    )
    assert "replicas" not in rendered.component("Deployment", "decode-worker")["spec"]
    unified = render([], {"worker.extraArgs[0]": "--kv-transfer-config=/etc/kv.json"})
    assert not unified.has("Deployment", "decode-worker")
