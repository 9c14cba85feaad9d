"""The Kubernetes backend: one batch/v1 Job per fine-tuning job, in the release namespace.

Created, read and deleted through the ``kubernetes`` client (in-cluster credentials, or
the local kubeconfig outside a cluster); progress comes from the pod's log, whose JSON
lines are the trainer's events. A cancel deletes the Job (and its pod, foreground). A
registry that restarts adopts running Jobs: they do not depend on it. A Job that vanished
(deleted by hand, or its TTL ran out before anyone read it) fails the job with that reason.
"""

from __future__ import annotations

import logging
from typing import Any

from preft_serve.common.objectstore import ObjectStoreSettings
from preft_serve.registry.finetune.runners.base import Observation, Runner, RunState, parse_line
from preft_serve.registry.finetune.runners.k8s_manifest import (
    JOB_LABEL,
    build_job,
    job_name,
    job_state,
    pod_failure,
)
from preft_serve.registry.finetune.settings import KubernetesSettings
from preft_serve.registry.finetune.spec import TrainerSpec

logger = logging.getLogger(__name__)


class KubernetesRunner(Runner):
    name = "kubernetes"
    poll_every_s = 5.0  # each poll reads the Job and its pod's whole log

    def __init__(
        self,
        settings: KubernetesSettings,
        store: ObjectStoreSettings,
        timeout_s: int,
        disk_bytes: int,
    ) -> None:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self.settings, self.store, self.timeout_s = settings, store, timeout_s
        self.disk_bytes = disk_bytes
        self.batch = client.BatchV1Api()
        self.core = client.CoreV1Api()

    def start(self, spec: TrainerSpec, tenant: str) -> dict[str, Any]:
        body = build_job(spec, tenant, self.store, self.settings, self.timeout_s, self.disk_bytes)
        self.batch.create_namespaced_job(self.settings.namespace, body)
        return {"backend": self.name, "job_name": job_name(spec.job_id), "log_lines": 0}

    def poll(self, job_id: str, runner: dict[str, Any]) -> Observation:
        from kubernetes.client.exceptions import ApiException

        name = runner.get("job_name") or job_name(job_id)
        try:
            job = self.batch.read_namespaced_job_status(name, self.settings.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return Observation(
                    RunState.FAILED,
                    reason=f"the Kubernetes Job {name} no "
                    "longer exists (deleted, or removed by its TTL)",
                )
            raise
        state, reason = job_state(job)
        lines, seen, pod_reason = self._new_lines(job_id, int(runner.get("log_lines", 0)))
        if state is RunState.FAILED and pod_reason:
            reason = f"{reason}; {pod_reason}"
        errors = [str(line.get("message")) for line in lines if line.get("preft_event") == "error"]
        if state is RunState.FAILED and errors:
            reason = f"{reason}: {errors[-1]}"
        return Observation(state, lines, reason, runner={**runner, "log_lines": seen})

    def _new_lines(self, job_id: str, seen: int) -> tuple[list[dict[str, Any]], int, str | None]:
        from kubernetes.client.exceptions import ApiException

        pods = self.core.list_namespaced_pod(
            self.settings.namespace, label_selector=f"{JOB_LABEL}={job_id.lower()[:63]}"
        )
        if not pods.items:
            return [], seen, None
        pod = pods.items[0]
        try:
            log = self.core.read_namespaced_pod_log(
                pod.metadata.name, self.settings.namespace, container="trainer"
            )
        except ApiException:  # not started yet
            return [], seen, pod_failure(pod)
        parsed = [p for p in (parse_line(line) for line in log.splitlines()) if p is not None]
        return parsed[seen:], len(parsed), pod_failure(pod)

    def cancel(self, job_id: str, runner: dict[str, Any]) -> None:
        from kubernetes.client import V1DeleteOptions
        from kubernetes.client.exceptions import ApiException

        try:
            self.batch.delete_namespaced_job(
                runner.get("job_name") or job_name(job_id),
                self.settings.namespace,
                body=V1DeleteOptions(propagation_policy="Foreground"),
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def orphan(self, job_id: str, runner: dict[str, Any]) -> str | None:
        return None  # the Job runs on; this registry follows it from now on
