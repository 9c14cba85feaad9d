"""Per-component knobs a platform team expects from a chart: security contexts, probes,
priority and runtime classes, extra env/volumes/init containers, image digests and one
registry mirror for every image (global.imageRegistry). Defaults render what the chart
hard-coded before; ci/platform-values.yaml turns everything on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.manifests import container, pod_spec, workloads
from tests.chart.support import Rendered

COMPONENTS = {
    "gateway": "Deployment",
    "registry": "Deployment",
    "worker": "Deployment",
    "redis": "StatefulSet",
}
DIGEST = "sha256:" + "ab" * 32


def workload(rendered: Rendered, component: str) -> dict[str, Any]:
    return rendered.component(COMPONENTS[component], component)


def main_container(rendered: Rendered, component: str) -> dict[str, Any]:
    return container(workload(rendered, component), component)


def all_images(rendered: Rendered) -> list[str]:
    images = []
    for item in workloads(rendered) + rendered.of_kind("Pod"):
        spec = pod_spec(item)
        images += [c["image"] for c in spec.get("initContainers", []) + spec["containers"]]
    return images


def test_defaults_keep_the_hard_coded_security_contexts(scenarios: dict[str, Rendered]) -> None:
    rendered = scenarios["default"]
    for component, uid in [
        ("gateway", 10001),
        ("registry", 10001),
        ("worker", 10001),
        ("redis", 999),
    ]:
        pod = pod_spec(workload(rendered, component))["securityContext"]
        assert pod == {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": uid,
            "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        main = main_container(rendered, component)["securityContext"]
        assert main == {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }


def test_security_contexts_are_overridable(render: Callable[..., Rendered]) -> None:
    rendered = render(
        [],
        {
            "worker.podSecurityContext.runAsUser": "2000",
            "worker.podSecurityContext.fsGroup": "null",
            "gateway.podSecurityContext.enabled": "false",
            "registry.containerSecurityContext.enabled": "false",
            "redis.containerSecurityContext.readOnlyRootFilesystem": "false",
        },
    )
    worker = pod_spec(workload(rendered, "worker"))["securityContext"]
    assert worker["runAsUser"] == 2000 and "fsGroup" not in worker
    assert "securityContext" not in pod_spec(workload(rendered, "gateway"))
    assert "securityContext" not in main_container(rendered, "registry")
    assert main_container(rendered, "redis")["securityContext"]["readOnlyRootFilesystem"] is False


def test_openshift_style_contexts_set_no_uid(scenarios: dict[str, Rendered]) -> None:
    """platform-values drops runAsUser/runAsGroup/fsGroup (null) and keeps the rest."""
    rendered = scenarios["platform"]
    for component in COMPONENTS:
        pod = pod_spec(workload(rendered, component))["securityContext"]
        assert pod == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        assert main_container(rendered, component)["securityContext"]["capabilities"] == {
            "drop": ["ALL"]
        }


def test_image_digest_wins_over_the_tag(render: Callable[..., Rendered]) -> None:
    rendered = render(
        [],
        {
            "image.tag": "0.9.0",
            "gateway.image.tag": "0.9.1",
            "gateway.image.digest": DIGEST,
            "redis.image.digest": DIGEST,
        },
    )
    assert main_container(rendered, "gateway")["image"] == f"ghcr.io/preft-serve/gateway@{DIGEST}"
    assert main_container(rendered, "registry")["image"] == "ghcr.io/preft-serve/registry:0.9.0"
    assert main_container(rendered, "redis")["image"] == f"docker.io/library/redis@{DIGEST}"
    # The helm test pod runs the gateway image, digest included.
    (test_pod,) = rendered.of_kind("Pod")
    assert test_pod["spec"]["containers"][0]["image"] == f"ghcr.io/preft-serve/gateway@{DIGEST}"


def test_global_image_registry_replaces_every_registry(scenarios: dict[str, Rendered]) -> None:
    images = all_images(scenarios["platform"])
    assert len(images) >= 6
    for image in images:
        assert image.startswith("mirror.example.com/preft/"), image
        assert "@sha256:" in image and ":" not in image.split("@")[0].split("/", 1)[1], image
    assert "mirror.example.com/preft/library/redis@sha256:" in " ".join(images)


def test_priority_and_runtime_classes(scenarios: dict[str, Rendered]) -> None:
    rendered = scenarios["platform"]
    worker = pod_spec(workload(rendered, "worker"))
    assert (worker["priorityClassName"], worker["runtimeClassName"]) == ("preft-gpu", "nvidia")
    for component in ("gateway", "registry", "redis"):
        spec = pod_spec(workload(rendered, component))
        assert spec["priorityClassName"] == "preft-serving" and "runtimeClassName" not in spec
    for item in workloads(scenarios["default"]):
        assert not {"priorityClassName", "runtimeClassName"} & set(pod_spec(item))


def test_probe_timing_custom_probes_and_switches(
    scenarios: dict[str, Rendered], render: Callable[..., Rendered]
) -> None:
    platform = scenarios["platform"]
    worker = main_container(platform, "worker")
    assert worker["startupProbe"] == {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 360,
    }
    assert worker["livenessProbe"] == {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": 30,
        "timeoutSeconds": 20,
        "failureThreshold": 3,
    }
    assert main_container(platform, "gateway")["readinessProbe"]["periodSeconds"] == 3
    assert main_container(platform, "redis")["startupProbe"]["tcpSocket"] == {"port": "redis"}
    default = scenarios["default"]
    assert "startupProbe" not in main_container(default, "gateway")
    assert main_container(default, "worker")["startupProbe"]["failureThreshold"] == 180
    off = render(
        [], {"gateway.livenessProbe.enabled": "false", "worker.readinessProbe.enabled": "false"}
    )
    assert "livenessProbe" not in main_container(off, "gateway")
    assert "readinessProbe" not in main_container(off, "worker")


def test_extra_env_volumes_and_init_containers(scenarios: dict[str, Rendered]) -> None:
    rendered = scenarios["platform"]
    for component in ("gateway", "registry", "worker"):
        spec = pod_spec(workload(rendered, component))
        main = main_container(rendered, component)
        assert {"name": "ca-bundle", "configMap": {"name": "corp-ca-bundle"}} in spec["volumes"]
        assert {"name": "ca-bundle", "mountPath": "/etc/ssl/corp", "readOnly": True} in main[
            "volumeMounts"
        ]
    assert main_container(rendered, "gateway")["envFrom"] == [
        {"configMapRef": {"name": "corp-proxy"}}
    ]
    assert {"name": "SSL_CERT_FILE", "value": "/etc/ssl/corp/ca.pem"} in main_container(
        rendered, "registry"
    )["env"]
    (init,) = pod_spec(workload(rendered, "worker"))["initContainers"]
    assert init["name"] == "wait-for-gpu" and init["command"] == ["nvidia-smi"]
    for item in workloads(scenarios["default"]):
        assert "initContainers" not in pod_spec(item)
        assert all("envFrom" not in c for c in pod_spec(item)["containers"])


def test_redis_extra_volumes_keep_its_data_volume(
    render: Callable[..., Rendered], tmp_path: Path
) -> None:
    values = tmp_path / "redis.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "redis": {
                    "persistence": {"enabled": False},
                    "extraVolumes": [{"name": "conf", "configMap": {"name": "redis-conf"}}],
                    "extraVolumeMounts": [{"name": "conf", "mountPath": "/etc/redis"}],
                    "extraEnv": [{"name": "TZ", "value": "UTC"}],
                }
            }
        )
    )
    rendered = render([str(values)])
    spec = pod_spec(workload(rendered, "redis"))
    assert spec["volumes"] == [
        {"name": "data", "emptyDir": {}},
        {"name": "conf", "configMap": {"name": "redis-conf"}},
    ]
    redis = main_container(rendered, "redis")
    assert [m["name"] for m in redis["volumeMounts"]] == ["data", "conf"]
    assert {"name": "TZ", "value": "UTC"} in redis["env"]


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        ({"gateway.image.digest": "sha256:1234"}, "/gateway/image/digest"),
        ({"redis.image.digest": "latest"}, "/redis/image/digest"),
        ({"worker.livenessProbe.periodSecond": "5"}, "'periodSecond' not allowed"),
        ({"worker.startupProbe.failureThreshold": "0"}, "/worker/startupProbe/failureThreshold"),
        ({"registry.priorityClassName": "High Priority"}, "/registry/priorityClassName"),
        ({"gateway.extraVolumeMounts[0].name": "x"}, "/gateway/extraVolumeMounts/0"),
        ({"worker.podSecurityContext.runAsUser": "root"}, "/worker/podSecurityContext/runAsUser"),
        ({"global.imageRegistry": "https://mirror"}, "/global/imageRegistry"),
    ],
)
def test_schema_refuses_bad_knobs(
    render_error: Callable[..., str], sets: dict[str, str], expected: str
) -> None:
    message = render_error([], sets)
    assert "values don't meet the specifications of the schema" in message
    assert expected in message
