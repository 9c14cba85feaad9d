"""The batch/v1 Job of one fine-tuning job, built from the kubernetes client's models, and
how a Job's status maps to a job state. Pure functions: the tests validate the manifest
against the Kubernetes schemas and feed real ``V1Job`` objects to :func:`job_state`."""

from __future__ import annotations

import re
from typing import Any

from kubernetes import client as k8s

from preft_serve.common.objectstore import ObjectStoreKind, ObjectStoreSettings, parse_store_url
from preft_serve.registry.finetune.runners.base import RunState
from preft_serve.registry.finetune.settings import KubernetesSettings
from preft_serve.registry.finetune.spec import TrainerSpec

CONTAINER = "trainer"
JOB_LABEL = "preft-serve.io/fine-tuning-job"
_STORE = "PREFT_TRAINER_OBJECT_STORE__"


def job_name(job_id: str) -> str:
    """A DNS-1123 name: job ids mix cases, so lowercase and keep it under 63 chars."""
    return "preft-" + re.sub(r"[^a-z0-9-]", "", job_id.lower())[:50]


def _env(
    spec: TrainerSpec, store: ObjectStoreSettings, settings: KubernetesSettings
) -> list[k8s.V1EnvVar]:
    kind, _ = parse_store_url(store.url)
    if kind is ObjectStoreKind.LOCAL:
        raise ValueError(
            "the Kubernetes fine-tuning backend needs an S3 object store (a "
            "trainer pod cannot reach the registry's local directory)"
        )
    env = [
        k8s.V1EnvVar(name="PREFT_TRAINER_SPEC", value=spec.model_dump_json()),
        k8s.V1EnvVar(name=f"{_STORE}URL", value=store.url),
        k8s.V1EnvVar(name="PYTHONUNBUFFERED", value="1"),
    ]
    if store.s3_endpoint_url:
        env.append(k8s.V1EnvVar(name=f"{_STORE}S3_ENDPOINT_URL", value=store.s3_endpoint_url))
    if store.s3_region:
        env.append(k8s.V1EnvVar(name=f"{_STORE}S3_REGION", value=store.s3_region))
    if settings.s3_credentials_secret:  # never the registry's own secret values inline
        for var, key in (
            (f"{_STORE}S3_ACCESS_KEY_ID", settings.s3_access_key_id_key),
            (f"{_STORE}S3_SECRET_ACCESS_KEY", settings.s3_secret_access_key_key),
        ):
            env.append(
                k8s.V1EnvVar(
                    name=var,
                    value_from=k8s.V1EnvVarSource(
                        secret_key_ref=k8s.V1SecretKeySelector(
                            name=settings.s3_credentials_secret, key=key
                        )
                    ),
                )
            )
    return env


def build_job(
    spec: TrainerSpec,
    tenant: str,
    store: ObjectStoreSettings,
    settings: KubernetesSettings,
    timeout_s: int,
    disk_bytes: int = 4 << 30,
) -> k8s.V1Job:
    """The Job: one pod, no retries (a failed trainer is a failed job), a deadline, a
    bounded scratch disk (``/tmp`` and the container's ephemeral storage, ``disk_bytes``)
    and a TTL so Kubernetes removes it after the registry has read its outcome."""
    limits = {"ephemeral-storage": str(disk_bytes), **(settings.resources.get("limits") or {})}
    labels = {
        **settings.labels,
        "app.kubernetes.io/name": "preft-serve",
        "app.kubernetes.io/component": "trainer",
        JOB_LABEL: spec.job_id.lower()[:63],
        "preft-serve.io/tenant": tenant,
    }
    volume: dict[str, Any] = {"name": "model", **settings.model_volume}
    container = k8s.V1Container(
        name=CONTAINER,
        image=settings.image,
        image_pull_policy=settings.image_pull_policy,
        command=["python3", "-m", "preft_serve.registry.finetune.entry"],
        env=_env(spec, store, settings),
        resources=k8s.V1ResourceRequirements(
            requests=settings.resources.get("requests"), limits=limits
        ),
        volume_mounts=[
            k8s.V1VolumeMount(name="model", mount_path=settings.model_mount_path, read_only=True),
            k8s.V1VolumeMount(name="tmp", mount_path="/tmp"),
        ],
        security_context=k8s.V1SecurityContext(
            allow_privilege_escalation=False,
            read_only_root_filesystem=True,
            run_as_non_root=True,
            capabilities=k8s.V1Capabilities(drop=["ALL"]),
        ),
    )
    pod = k8s.V1PodSpec(
        restart_policy="Never",
        containers=[container],
        service_account_name=settings.service_account,
        automount_service_account_token=False,
        node_selector=settings.node_selector or None,
        # Values in Kubernetes' own JSON spelling (camelCase, from values.yaml) go in as
        # dicts: the client serialises them unchanged.
        tolerations=list(settings.tolerations) or None,
        image_pull_secrets=[k8s.V1LocalObjectReference(name=n) for n in settings.image_pull_secrets]
        or None,
        volumes=[
            volume,
            k8s.V1Volume(
                name="tmp", empty_dir=k8s.V1EmptyDirVolumeSource(size_limit=str(disk_bytes))
            ),
        ],
    )
    return k8s.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=k8s.V1ObjectMeta(
            name=job_name(spec.job_id), namespace=settings.namespace, labels=labels
        ),
        spec=k8s.V1JobSpec(
            backoff_limit=0,
            active_deadline_seconds=timeout_s,
            ttl_seconds_after_finished=settings.ttl_seconds_after_finished,
            template=k8s.V1PodTemplateSpec(metadata=k8s.V1ObjectMeta(labels=labels), spec=pod),
        ),
    )


def job_state(job: k8s.V1Job) -> tuple[RunState, str | None]:
    """RUNNING until a Complete/Failed condition is True (or the counters say so)."""
    status = job.status or k8s.V1JobStatus()
    for condition in status.conditions or []:
        if condition.status != "True":
            continue
        if condition.type in ("Complete", "SuccessCriteriaMet"):
            return RunState.SUCCEEDED, None
        if condition.type in ("Failed", "FailureTarget"):
            reason = condition.reason or "Failed"
            message = f": {condition.message}" if condition.message else ""
            return RunState.FAILED, f"the Kubernetes Job failed ({reason}){message}"
    if status.succeeded:
        return RunState.SUCCEEDED, None
    if status.failed:
        return RunState.FAILED, "the trainer pod failed"
    return RunState.RUNNING, None


def pod_failure(pod: k8s.V1Pod) -> str | None:
    """Why the trainer container ended, from its last state (OOMKilled, exit code ...)."""
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        term = cs.state.terminated if cs.state else None
        if term is not None and term.exit_code != 0:
            return f"container {cs.name} {term.reason or 'Error'} (exit code {term.exit_code})"
        waiting = cs.state.waiting if cs.state else None
        if waiting is not None and waiting.reason in (
            "ImagePullBackOff",
            "ErrImagePull",
            "CreateContainerConfigError",
        ):
            return f"container {cs.name} cannot start: {waiting.reason}"
    return None
