"""The fine-tuning settings, nested in the registry's (``PREFT_REGISTRY_FINETUNE__...``)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field


class Backend(str, enum.Enum):
    """Where trainers run."""

    LOCAL = "local"  # a bounded pool of processes beside the registry (make run, tests)
    KUBERNETES = "kubernetes"  # one batch/v1 Job per fine-tuning job


def _quantity(value: object) -> object:
    """A Kubernetes quantity as text: ``cpu: 4`` in a values file arrives as a number (a
    float, from Helm), and the Job's resources take strings."""
    if isinstance(value, bool):
        return value  # refused by the str type below
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return value


Quantity = Annotated[str, BeforeValidator(_quantity)]


class KubernetesSettings(BaseModel):
    """How the Kubernetes backend builds a trainer Job (the chart fills these in)."""

    namespace: str = Field("default", description="Namespace of the Jobs (the release's)")
    image: str = Field("ghcr.io/preft-serve/trainer:latest", description="Trainer image")
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: list[str] = Field(default_factory=list)
    service_account: str | None = Field(None, description="ServiceAccount of trainer pods")
    resources: dict[str, dict[str, Quantity]] = Field(
        default_factory=lambda: {
            "requests": {"cpu": "2", "memory": "8Gi"},
            "limits": {"memory": "16Gi"},
        },
        description="Trainer container resources (requests/limits)",
    )
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict, description="Extra pod/Job labels")
    model_volume: dict[str, Any] = Field(
        default_factory=lambda: {
            "persistentVolumeClaim": {"claimName": "preft-models", "readOnly": True}
        },
        description="Volume source holding the base model directory",
    )
    model_mount_path: str = "/models"
    model_path: str = Field("/models/base", description="The model directory in the pod")
    s3_credentials_secret: str | None = Field(
        None,
        description="Secret with the object store's keys (AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY); empty: IRSA / node identity",
    )
    s3_access_key_id_key: str = "AWS_ACCESS_KEY_ID"
    s3_secret_access_key_key: str = "AWS_SECRET_ACCESS_KEY"
    ttl_seconds_after_finished: int = Field(
        3600, ge=0, description="Finished Jobs are deleted by Kubernetes after this"
    )


class FinetuneSettings(BaseModel):
    """Limits and the execution backend of fine-tuning jobs."""

    enabled: bool = Field(True, description="Serve /v1/files and /v1/fine_tuning")
    backend: Backend = Backend.LOCAL
    workers: int = Field(
        1, ge=1, le=64, description="Local backend: trainer processes at once (all tenants)"
    )
    tenant_max_running: int = Field(
        1, ge=1, le=1000, description="Jobs one tenant may have running at once; more wait queued"
    )
    tenant_max_queued: int = Field(
        4,
        ge=0,
        le=10000,
        description="Jobs one tenant may have waiting; creating one more is refused (429)",
    )
    tenant_max_jobs_kept: int = Field(
        1000,
        ge=1,
        description="Finished jobs (succeeded, failed, cancelled) one tenant keeps: "
        "creating a job deletes those that ended first past this, with their events",
    )
    tenant_max_files: int = Field(100, ge=1, le=100000, description="Files one tenant keeps")
    max_file_bytes: int = Field(
        64 << 20, ge=1024, le=1 << 34, description="Largest training/validation file"
    )
    max_examples: int = Field(50_000, ge=1, description="Conversations one file may hold")
    max_steps: int = Field(20_000, ge=1, description="Optimizer steps one job may run")
    job_timeout_s: int = Field(
        6 * 3600,
        ge=10,
        description="A job running longer fails "
        "(local trainers also get this many CPU seconds per core)",
    )
    trainer_memory_bytes: int = Field(
        8 << 30,
        ge=1 << 30,
        description="Memory one trainer may use: a job whose estimate "
        "is larger is refused (400); local trainers get it as their data-segment limit and "
        "are stopped when their resident memory passes it. Kubernetes: the Job's "
        "resources.limits.memory, when set, is the limit",
    )
    trainer_disk_bytes: int = Field(
        4 << 30,
        ge=64 << 20,
        description="Largest file a local trainer may write; on "
        "Kubernetes the size of the trainer's /tmp and its ephemeral-storage limit",
    )
    work_dir: Path | None = Field(
        None,
        description="Local backend: scratch directories of trainers (default: the system temp dir)",
    )
    poll_s: float = Field(0.5, gt=0, le=60, description="Dispatcher loop period")
    heartbeat_s: float = Field(
        15,
        ge=1,
        le=600,
        description="A registry that has not "
        "refreshed its runner heartbeat this long is dead: its "
        "local jobs fail, its Kubernetes jobs are adopted",
    )
    events_maxlen: int = Field(10_000, ge=100, description="Events kept per job")
    kubernetes: KubernetesSettings = KubernetesSettings()

    def memory_limit(self) -> int:
        """A trainer's memory limit in bytes, for the job's backend."""
        if self.backend is Backend.KUBERNETES:
            memory = (self.kubernetes.resources.get("limits") or {}).get("memory")
            if memory:
                from kubernetes.utils.quantity import parse_quantity

                return int(parse_quantity(memory))
        return self.trainer_memory_bytes
