"""Building the fine-tuning services from the registry's state, once, in its lifespan."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from preft_serve.registry.finetune.budget import ModelShape
from preft_serve.registry.finetune.dispatcher import Dispatcher, new_instance
from preft_serve.registry.finetune.files import FileService
from preft_serve.registry.finetune.jobs import JobStore
from preft_serve.registry.finetune.runners import create_runner
from preft_serve.registry.finetune.service import FineTuningService
from preft_serve.registry.finetune.settings import Backend
from preft_serve.registry.metrics import RegistryMetrics

if TYPE_CHECKING:
    from preft_serve.registry.state import RegistryState


@dataclasses.dataclass
class FinetuneParts:
    files: FileService
    jobs: FineTuningService
    dispatcher: Dispatcher

    def start(self) -> None:
        self.dispatcher.start()

    def close(self) -> None:
        self.dispatcher.stop()


def build_finetune(state: RegistryState, metrics: RegistryMetrics | None = None
                   ) -> FinetuneParts:
    settings = state.settings
    ft = settings.finetune
    keys = state.adapters.keys
    files = FileService(state.redis, keys, state.store, ft, settings.staging_dir)
    store = JobStore(state.redis, keys, ft.events_maxlen)
    files.jobs_using = store.using_file
    jobs = FineTuningService(store, files, ft, settings.base_model_label,
                             settings.max_lora_rank, settings.max_reft_rank,
                             ModelShape.read(settings.base_model_config))
    instance = new_instance()
    runner = create_runner(ft, settings.object_store, instance, ft.work_dir)
    model_dir = settings.base_model if settings.base_model.is_dir() \
        else settings.base_model.parent
    model_path = ft.kubernetes.model_path if ft.backend is Backend.KUBERNETES \
        else str(model_dir.resolve())
    dispatcher = Dispatcher(store, files, state.adapters, runner, ft, model_path, instance,
                            metrics)
    jobs.canceller, jobs.metrics = dispatcher, metrics
    return FinetuneParts(files, jobs, dispatcher)
