"""The chart's fine-tuning trainer (trainer.enabled): the registry may create Jobs in the
release namespace only; its settings come from a ConfigMap the registry's own settings
class parses; the Job the registry would build from them validates against the Kubernetes
schemas; the failed-jobs alert fires on failures only; the trainer image is non-root.
No cluster is reachable here: the Job is checked as a manifest."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes import client as k8s

from preft_serve.registry.finetune.runners.k8s_manifest import build_job
from preft_serve.registry.finetune.spec import TrainerSpec
from tests.chart.manifests import container, env, pod_spec
from tests.chart.support import NAMESPACE, ROOT, Rendered

ON = {
    "trainer.enabled": "true",
    "metrics.prometheusRule.enabled": "true",
    "trainer.nodeSelector.pool": "gpu",
    "objectStore.existingSecret": "s3-keys",
}
SPEC = TrainerSpec(
    job_id="ftjob-" + "a1" * 12,
    model="/models/base",
    training_key="files/" + "b" * 64 + ".jsonl",
    options={
        "adapter": "lora",
        "mode": "prefill",
        "rank": 8,
        "epochs": 3,
        "batch_size": 8,
        "learning_rate": 2e-3,
        "seed": 0,
        "max_seq_len": 1024,
    },
)


@pytest.fixture(scope="module")
def enabled(render: Callable[..., Rendered]) -> Rendered:
    return render(sets=ON)


def test_off_by_default(scenarios: dict[str, Rendered]) -> None:
    for rendered in scenarios.values():
        assert not rendered.has("Role", "trainer") and not rendered.has("ConfigMap", "trainer")
        registry = container(rendered.component("Deployment", "registry"), "registry")
        assert env(registry)["PREFT_REGISTRY_FINETUNE__ENABLED"] == "false"


def test_rbac_is_namespaced_and_minimal(enabled: Rendered) -> None:
    assert not enabled.of_kind("ClusterRole") and not enabled.of_kind("ClusterRoleBinding")
    role = enabled.component("Role", "trainer")
    assert role["metadata"]["namespace"] == NAMESPACE
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("batch",), ("jobs",)): {"create", "get", "list", "watch", "delete"},
        (("batch",), ("jobs/status",)): {"get"},
        (("",), ("pods",)): {"get", "list"},
        (("",), ("pods/log",)): {"get"},
    }
    binding = enabled.component("RoleBinding", "trainer")
    registry = enabled.component("Deployment", "registry")
    pod = pod_spec(registry)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "namespace": NAMESPACE, "name": pod["serviceAccountName"]}
    ]
    assert pod["automountServiceAccountToken"] is True  # the registry calls the API


def test_manifests_match_the_kubernetes_schemas(enabled: Rendered) -> None:
    version = kubernetes_validate.latest_version()
    for doc in enabled.docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com"):
            continue
        kubernetes_validate.validate(doc, version, strict=True)


def test_registry_builds_a_valid_job_from_the_chart(
    enabled: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ConfigMap and the registry's env, read by RegistrySettings as in the pod, give
    the Job the registry would create; it validates and carries the values."""
    from preft_serve.registry.settings import RegistrySettings

    registry = container(enabled.component("Deployment", "registry"), "registry")
    assert (
        registry["envFrom"][0]["configMapRef"]["name"]
        == enabled.component("ConfigMap", "trainer")["metadata"]["name"]
    )
    (tmp_path / "config.json").write_text("{}")
    variables = {
        **env(registry),
        **enabled.component("ConfigMap", "trainer")["data"],
        "PREFT_REGISTRY_BASE_MODEL": str(tmp_path),
    }
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    settings = RegistrySettings()  # type: ignore[call-arg]
    ft = settings.finetune
    assert ft.enabled and ft.backend.value == "kubernetes"
    job = build_job(SPEC, "acme", settings.object_store, ft.kubernetes, ft.job_timeout_s)
    doc = k8s.ApiClient().sanitize_for_serialization(job)
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    assert doc["metadata"]["namespace"] == NAMESPACE
    pod = doc["spec"]["template"]["spec"]
    trainer = pod["containers"][0]
    assert trainer["image"].endswith("/trainer-gpu:" + trainer["image"].rsplit(":", 1)[1])
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert (
        pod["serviceAccountName"]
        == pod_spec(enabled.component("Deployment", "registry"))["serviceAccountName"]
    )
    names = {e["name"]: e for e in trainer["env"]}
    assert (
        names["PREFT_TRAINER_OBJECT_STORE__S3_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"]
        == "s3-keys"
    )
    assert doc["spec"]["activeDeadlineSeconds"] == 21600
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "preft-models"


def test_failed_jobs_alert(enabled: Rendered, promtool: str, tmp_path: Path) -> None:
    rule = enabled.component("PrometheusRule", "trainer")
    groups = rule["spec"]["groups"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    series = 'preft_registry_finetune_jobs_finished_total{namespace="%s",status="%s"}'

    def case(status: str, fires: bool) -> dict[str, Any]:
        alerts = (
            [
                {
                    "exp_labels": {"severity": "warning"},
                    "exp_annotations": {
                        "summary": groups[0]["rules"][0]["annotations"]["summary"].replace(
                            "{{ $value }}", "2"
                        )
                    },
                }
            ]
            if fires
            else []
        )
        return {
            "interval": "1m",
            "input_series": [
                {"series": series % (NAMESPACE, status), "values": "0 0 0 1 2 2 2 2 2 2"}
            ],
            "alert_rule_test": [
                {"eval_time": "8m", "alertname": "PreftFineTuningJobsFailing", "exp_alerts": alerts}
            ],
        }

    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump(
            {
                "rule_files": ["rules.yaml"],
                "evaluation_interval": "1m",
                "tests": [case("failed", True), case("succeeded", False)],
            }
        )
    )
    result = subprocess.run(
        [promtool, "test", "rules", "tests.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    docs = (ROOT / "docs" / "fine-tuning.md").read_text()
    assert "### PreftFineTuningJobsFailing" in docs


def test_trainer_image() -> None:
    from tests.chart.test_images import final_stage, parse_dockerfile

    stage = final_stage(parse_dockerfile(ROOT / "docker" / "trainer.Dockerfile"))
    user = [i.args for i in stage if i.keyword == "USER"]
    assert user == ["10001:10001"]
    entry = [i.args for i in stage if i.keyword == "ENTRYPOINT"]
    assert entry == ['["python3", "-m", "preft_serve.registry.finetune.entry"]']
    assert build_job(SPEC, "t", _s3(), _k8s(), 60).spec.template.spec.containers[0].command == [
        "python3",
        "-m",
        "preft_serve.registry.finetune.entry",
    ]
    instructions = " ".join(
        i.args for i in parse_dockerfile(ROOT / "docker" / "trainer.Dockerfile")
    )
    assert "vllm" not in instructions.lower()  # torch + transformers + peft only
    assert "SECRET" not in instructions and "PASSWORD" not in instructions


def _s3() -> Any:
    from preft_serve.common.objectstore import ObjectStoreSettings

    return ObjectStoreSettings(url="s3://b")


def _k8s() -> Any:
    from preft_serve.registry.finetune.settings import KubernetesSettings

    return KubernetesSettings()


def test_quantities_written_as_numbers_in_a_values_file_reach_the_job(
    render: Callable[..., Rendered], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cpu: 4`` in a values file reaches the templates as a number, not a string: the
    registry still starts and the Job asks for "4"."""
    from preft_serve.registry.settings import RegistrySettings

    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {"trainer": {"resources": {"requests": {"cpu": 4, "memory": "8Gi"},
                                       "limits": {"cpu": 0.5, "memory": 17179869184}}}}
        )
    )  # fmt: skip
    rendered = render([str(values)], ON)
    registry = container(rendered.component("Deployment", "registry"), "registry")
    (tmp_path / "config.json").write_text("{}")
    variables = {
        **env(registry),
        **rendered.component("ConfigMap", "trainer")["data"],
        "PREFT_REGISTRY_BASE_MODEL": str(tmp_path),
    }
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    ft = RegistrySettings().finetune  # type: ignore[call-arg]
    job = build_job(SPEC, "acme", _s3(), ft.kubernetes, ft.job_timeout_s)
    resources = k8s.ApiClient().sanitize_for_serialization(job)["spec"]["template"]["spec"][
        "containers"
    ][0]["resources"]
    assert resources["requests"] == {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"}
    limits = resources["limits"]
    assert (limits["cpu"], limits["memory"], limits["nvidia.com/gpu"]) == (
        "0.5",
        "17179869184",
        "1",
    )
