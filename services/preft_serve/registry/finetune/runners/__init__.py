"""Trainer backends behind one interface (:class:`Runner`), built by :func:`create_runner`."""

from __future__ import annotations

import os
from pathlib import Path

from preft_serve.common.objectstore import ObjectStoreSettings
from preft_serve.registry.finetune.runners.base import Observation, Runner, RunState, parse_line
from preft_serve.registry.finetune.settings import Backend, FinetuneSettings

__all__ = ["Observation", "RunState", "Runner", "create_runner", "parse_line"]


def create_runner(
    settings: FinetuneSettings, store: ObjectStoreSettings, instance: str, work_dir: Path | None
) -> Runner:
    """The backend ``settings.backend`` names (imports only what it needs)."""
    if settings.backend is Backend.LOCAL:
        from preft_serve.registry.finetune.runners.local import LocalRunner, TrainerLimits

        limits = TrainerLimits(
            memory_bytes=settings.trainer_memory_bytes,
            file_bytes=settings.trainer_disk_bytes,
            cpu_seconds=settings.job_timeout_s * (os.cpu_count() or 1),
        )
        return LocalRunner(settings.workers, store, instance, work_dir or settings.work_dir, limits)
    if settings.backend is Backend.KUBERNETES:
        from preft_serve.registry.finetune.runners.kubernetes import KubernetesRunner

        return KubernetesRunner(
            settings.kubernetes, store, settings.job_timeout_s, settings.trainer_disk_bytes
        )
    valid = ", ".join(b.value for b in Backend)
    raise ValueError(f"unknown fine-tuning backend {settings.backend!r}; valid: {valid}")
