"""The Kubernetes backend without a cluster (none is reachable here): the Job it creates
is validated against the Kubernetes schemas (as the chart's manifests are), serialised by
the client exactly as ``create_namespaced_job`` sends it; Job and pod states, as the API
server returns them (JSON through the client's own deserialiser), map to job states."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
from kubernetes import client as k8s
from pydantic import SecretStr

from preft_serve.common.objectstore import ObjectStoreSettings
from preft_serve.registry.finetune.runners.base import RunState
from preft_serve.registry.finetune.runners.k8s_manifest import (
    build_job,
    job_name,
    job_state,
    pod_failure,
)
from preft_serve.registry.finetune.settings import KubernetesSettings
from preft_serve.registry.finetune.spec import TrainerSpec

VERSIONS = ["1.29", kubernetes_validate.latest_version()]
SPEC = TrainerSpec(
    job_id="ftjob-AbCdEfGhIjKlMnOpQrStUvWx",
    model="/models/base",
    training_key="files/" + "a" * 64 + ".jsonl",
    validation_key=None,
    options={
        "adapter": "lora",
        "mode": "prefill",
        "rank": 8,
        "epochs": 3,
        "batch_size": 8,
        "learning_rate": 2e-3,
        "seed": 1,
        "max_seq_len": 1024,
    },
)
STORE = ObjectStoreSettings(
    url="s3://adapters/prod",
    s3_endpoint_url="http://minio:9000",
    s3_region="us-east-1",
    s3_access_key_id="AKIA",
    s3_secret_access_key=SecretStr("super-secret"),
)


def settings(**overrides: Any) -> KubernetesSettings:
    base: dict[str, Any] = {
        "namespace": "llm",
        "image": "ghcr.io/preft-serve/trainer:0.1.0",
        "service_account": "prod-preft-serve-trainer",
        "resources": {
            "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
            "limits": {"memory": "32Gi", "nvidia.com/gpu": "1"},
        },
        "node_selector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "image_pull_secrets": ["regcred"],
        "s3_credentials_secret": "prod-s3",
        "labels": {"app.kubernetes.io/instance": "prod"},
    }
    return KubernetesSettings(**{**base, **overrides})


def manifest(job: k8s.V1Job) -> dict[str, Any]:
    return k8s.ApiClient().sanitize_for_serialization(job)  # type: ignore[no-any-return]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("variant", ["gpu", "cpu-defaults"])
def test_job_manifest_matches_the_kubernetes_schema(version: str, variant: str) -> None:
    config = settings() if variant == "gpu" else KubernetesSettings()
    doc = manifest(build_job(SPEC, "acme", STORE, config, 3600))
    kubernetes_validate.validate(doc, version, strict=True)


def test_job_manifest_content() -> None:
    doc = manifest(build_job(SPEC, "acme", STORE, settings(), 7200, disk_bytes=1 << 30))
    assert doc["apiVersion"] == "batch/v1" and doc["kind"] == "Job"
    expected_name = "preft-ftjob-abcdefghijklmnopqrstuvwx"
    assert doc["metadata"]["name"] == job_name(SPEC.job_id) == expected_name
    assert doc["metadata"]["namespace"] == "llm"
    spec = doc["spec"]
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 7200
    assert spec["ttlSecondsAfterFinished"] == 3600
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["serviceAccountName"] == "prod-preft-serve-trainer"
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["limits"]["ephemeral-storage"] == str(1 << 30)
    env = {e["name"]: e for e in container["env"]}
    assert json.loads(env["PREFT_TRAINER_SPEC"]["value"]) == json.loads(SPEC.model_dump_json())
    assert env["PREFT_TRAINER_OBJECT_STORE__URL"]["value"] == "s3://adapters/prod"
    secret = env["PREFT_TRAINER_OBJECT_STORE__S3_SECRET_ACCESS_KEY"]["valueFrom"]
    assert secret == {"secretKeyRef": {"name": "prod-s3", "key": "AWS_SECRET_ACCESS_KEY"}}
    assert "super-secret" not in json.dumps(doc)  # credentials only by Secret reference
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"]["claimName"] == "preft-models"
    assert volumes["tmp"]["emptyDir"] == {"sizeLimit": str(1 << 30)}
    labels = spec["template"]["metadata"]["labels"]
    assert labels["preft-serve.io/tenant"] == "acme"
    assert labels["app.kubernetes.io/component"] == "trainer"


def test_a_local_object_store_is_refused() -> None:
    with pytest.raises(ValueError, match="needs an S3 object store"):
        build_job(SPEC, "acme", ObjectStoreSettings(url="/var/objects"), settings(), 60)


def from_api(kind: str, body: dict[str, Any]) -> Any:
    """A model as the client builds it from an API server's JSON reply."""

    class Reply:
        data = json.dumps(body)

    return k8s.ApiClient().deserialize(Reply(), kind)


def _job(status: dict[str, Any]) -> k8s.V1Job:
    return from_api(
        "V1Job",
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "preft-x"},
            "status": status,
        },
    )


@pytest.mark.parametrize(
    ("status", "state", "says"),
    [
        ({}, RunState.RUNNING, None),
        ({"active": 1, "startTime": "2026-12-01T00:00:00Z"}, RunState.RUNNING, None),
        (
            {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1},
            RunState.SUCCEEDED,
            None,
        ),
        (
            {"conditions": [{"type": "SuccessCriteriaMet", "status": "True"}]},
            RunState.SUCCEEDED,
            None,
        ),
        (
            {
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit",
                    }
                ],
                "failed": 1,
            },
            RunState.FAILED,
            "(BackoffLimitExceeded): Job has reached",
        ),
        (
            {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]},
            RunState.FAILED,
            "DeadlineExceeded",
        ),
        (
            {
                "conditions": [
                    {"type": "FailureTarget", "status": "True", "reason": "PodFailurePolicy"}
                ]
            },
            RunState.FAILED,
            "PodFailurePolicy",
        ),
        (
            {"conditions": [{"type": "Failed", "status": "False"}], "active": 1},
            RunState.RUNNING,
            None,
        ),
        ({"failed": 1}, RunState.FAILED, "pod failed"),
    ],
)
def test_job_status_maps_to_a_job_state(
    status: dict[str, Any], state: RunState, says: str | None
) -> None:
    got, reason = job_state(_job(status))
    assert got is state
    assert (reason is None) if says is None else (says in str(reason))


def test_pod_failure_reasons() -> None:
    def pod(state: dict[str, Any]) -> Any:
        return from_api(
            "V1Pod",
            {
                "status": {
                    "containerStatuses": [
                        {
                            "name": "trainer",
                            "image": "t",
                            "imageID": "",
                            "ready": False,
                            "restartCount": 0,
                            "state": state,
                        }
                    ]
                }
            },
        )

    oom = pod({"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
    assert pod_failure(oom) == "container trainer OOMKilled (exit code 137)"
    pull = pod({"waiting": {"reason": "ImagePullBackOff"}})
    assert pod_failure(pull) == "container trainer cannot start: ImagePullBackOff"
    assert pod_failure(pod({"terminated": {"exitCode": 0, "reason": "Completed"}})) is None
    assert pod_failure(pod({"running": {}})) is None
