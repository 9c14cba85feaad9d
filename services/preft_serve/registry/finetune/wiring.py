"""Building the fine-tuning services from the registry's clients, once, with its state
(``RegistryState.build``); the app starts them in its lifespan."""

from __future__ import annotations

import dataclasses

import redis

from preft_serve.common.objectstore import ObjectStore
from preft_serve.registry.adapters import AdapterService
from preft_serve.registry.audit import AuditLog
from preft_serve.registry.finetune.budget import ModelShape, longest_token_bytes
from preft_serve.registry.finetune.dispatcher import Dispatcher, new_instance
from preft_serve.registry.finetune.files import FileService
from preft_serve.registry.finetune.jobs import JobStore
from preft_serve.registry.finetune.runners import create_runner
from preft_serve.registry.finetune.service import FineTuningService
from preft_serve.registry.finetune.settings import Backend
from preft_serve.registry.metrics import RegistryMetrics
from preft_serve.registry.settings import RegistrySettings


@dataclasses.dataclass
class FinetuneParts:
    files: FileService
    jobs: FineTuningService
    dispatcher: Dispatcher

    def start(self) -> None:
        self.dispatcher.start()

    def close(self) -> None:
        self.dispatcher.stop()


def build_finetune(
    settings: RegistrySettings,
    client: redis.Redis,
    objects: ObjectStore,
    adapters: AdapterService,
    metrics: RegistryMetrics,
) -> FinetuneParts:
    """Each part is built whole, after the parts it needs: the job store before the files
    (which ask it what reads a file), the dispatcher before the jobs (which cancel through
    it)."""
    ft = settings.finetune
    keys = adapters.keys
    store = JobStore(client, keys, ft.events_maxlen)
    files = FileService(
        client, keys, objects, ft, settings.staging_dir, jobs_using=store.using_file
    )
    model_dir = settings.base_model if settings.base_model.is_dir() else settings.base_model.parent
    instance = new_instance()
    runner = create_runner(ft, settings.object_store, instance, ft.work_dir)
    model_path = (
        ft.kubernetes.model_path if ft.backend is Backend.KUBERNETES else str(model_dir.resolve())
    )
    audit = AuditLog.for_settings(client, settings, metrics.audit_write_failures)
    dispatcher = Dispatcher(
        store, files, adapters, runner, ft, model_path, instance, metrics, audit
    )
    # The base model's one public name, set to the gateway's (the chart and make run feed
    # both from one value), so the name /v1/models lists is the one accepted here.
    jobs = FineTuningService(
        store,
        files,
        ft,
        (settings.base_model_label,),
        settings.max_lora_rank,
        settings.max_reft_rank,
        ModelShape.read(settings.base_model_config),
        longest_token_bytes(model_dir),
        canceller=dispatcher,
        metrics=metrics,
        version_room=adapters.check_version_room,
    )
    return FinetuneParts(files, jobs, dispatcher)
