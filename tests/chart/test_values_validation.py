"""Bad values are refused before anything reaches the cluster, with messages that say
what to change: types and names by values.schema.json, cross-field rules by
templates/_validate.tpl (every problem in one run)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import yaml

from tests.chart.support import CHART, Rendered

APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        ({"worker.replicas": "-1"}, "/worker/replicas"),
        ({"worker.device": "tpu"}, "value must be one of 'gpu', 'cpu'"),
        ({"gateway.discovery": "static"}, "value must be one of 'kubernetes', 'dns'"),
        ({"objectStore.url": "/var/lib/blobs"}, "/objectStore/url"),
        ({"worker.maxLoraRank": "12"}, "/worker/maxLoraRank"),
        ({"workers.replicas": "3"}, "additional properties 'workers' not allowed"),
        ({"redis.image.tag": "latest"}, "/redis/image/tag"),
        ({"redis.persistence.size": "lots"}, "/redis/persistence/size"),
        ({"metrics.prometheusRule.thresholds.errorRatio": "5"}, "/errorRatio"),
    ],
)
def test_schema_refuses(
    render_error: Callable[..., str], sets: dict[str, str], expected: str
) -> None:
    message = render_error([], sets)
    assert "values don't meet the specifications of the schema" in message
    assert expected in message


def test_cross_field_problems_are_reported_together(render_error: Callable[..., str]) -> None:
    message = render_error(
        [],
        {
            "redis.enabled": "false",
            "worker.terminationGracePeriodSeconds": "60",
            "gateway.autoscaling.enabled": "false",
            "gateway.replicas": "1",
            "model.path": "/elsewhere/model",
            "registry.modelConfig": "not json",
            "worker.gpu.count": "0",
            "worker.maxLoras": "2",
            "worker.prefillReservedSlots": "2",
            "worker.tenantClassicSlots": "7",
            "gateway.tenantClassicAdaptersPerWorker": "8",
        },
    )
    assert "Invalid values for the preft-serve chart" in message
    for expected in [
        "redis.external.host is required when redis.enabled=false",
        (
            "worker.terminationGracePeriodSeconds (60) must exceed "
            "worker.preStopSleepSeconds + worker.shutdownTimeoutSeconds (135)"
        ),
        "gateway.pdb.minAvailable (1) must be below the gateway's replica count (1)",
        "model.path (/elsewhere/model) must be a directory under model.mountPath (/models)",
        "registry.modelConfig must be the base model's config.json",
        "worker.gpu.count must be at least 1 when worker.device=gpu",
        "worker.prefillReservedSlots (2) must be below worker.maxLoras (2)",
        "gateway.tenantClassicAdaptersPerWorker (8) must not exceed the workers' per-tenant share",
    ]:
        assert expected in message


def test_one_tenant_cannot_be_given_every_classic_slot(render_error: Callable[..., str]) -> None:
    message = render_error([], {"worker.maxLoras": "8", "worker.tenantClassicSlots": "6"})
    assert "worker.tenantClassicSlots (6) must be below worker.maxLoras" in message
    assert "prefillReservedSlots (6)" in message
    # The gateway's limit may not exceed the workers' share (half of 3 classic slots: 1).
    sets = {"worker.maxLoras": "4", "gateway.tenantClassicAdaptersPerWorker": "2"}
    message = render_error([], sets)
    assert "gateway.tenantClassicAdaptersPerWorker (2) must not exceed" in message
    assert "share of classic slots (1," in message


def test_autoscaling_bounds_are_checked(render_error: Callable[..., str]) -> None:
    message = render_error(
        [],
        {
            "worker.autoscaling.enabled": "true",
            "worker.autoscaling.minReplicas": "5",
            "worker.autoscaling.maxReplicas": "2",
        },
    )
    assert "worker.autoscaling.minReplicas (5) must not exceed maxReplicas (2)" in message


def test_fixing_the_values_renders(render: Callable[..., Rendered]) -> None:
    """The same kind of install with the fixes the messages ask for goes through."""
    rendered = render(
        [],
        {
            "redis.enabled": "false",
            "redis.external.host": "redis.internal",
            "worker.terminationGracePeriodSeconds": "140",
            "gateway.autoscaling.enabled": "false",
            "gateway.replicas": "2",
            "model.path": "/models/llama",
        },
    )
    assert not rendered.has("StatefulSet", "redis")
    assert rendered.component("Deployment", "gateway")["spec"]["replicas"] == 2


def test_cpu_workers_request_no_gpu(render: Callable[..., Rendered]) -> None:
    rendered = render(["ci/cpu-values.yaml"])
    worker = rendered.component("Deployment", "worker")
    spec = worker["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["image"] == f"ghcr.io/preft-serve/worker-cpu:{APP_VERSION}"
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert "tolerations" not in spec
    assert "--device=cpu" in container["args"] and "--kv-cache-gib=4" in container["args"]
    gpu = render([]).component("Deployment", "worker")["spec"]["template"]["spec"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert gpu["containers"][0]["image"] == f"ghcr.io/preft-serve/worker-gpu:{APP_VERSION}"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in gpu[
        "tolerations"
    ]
