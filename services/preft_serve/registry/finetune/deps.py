"""FastAPI dependencies of the fine-tuning routers: their services, from the registry's
state (authentication is the registry's own ``PrincipalDep``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from preft_serve.common.errors import NotFound
from preft_serve.registry.deps import StateDep
from preft_serve.registry.finetune.files import FileService
from preft_serve.registry.finetune.service import FineTuningService


def _files(state: StateDep) -> FileService:
    if state.finetune is None:
        raise NotFound("fine-tuning is disabled on this registry", code="not_found")
    return state.finetune.files


def _jobs(state: StateDep) -> FineTuningService:
    if state.finetune is None:
        raise NotFound("fine-tuning is disabled on this registry", code="not_found")
    return state.finetune.jobs


FilesDep = Annotated[FileService, Depends(_files)]
JobsDep = Annotated[FineTuningService, Depends(_jobs)]
