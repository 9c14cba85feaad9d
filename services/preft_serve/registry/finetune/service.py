"""What the /v1/fine_tuning endpoints do: create (checked, resolved, limited), read,
list, cancel, events and checkpoints. Execution is the dispatcher's."""

from __future__ import annotations

import dataclasses
import logging
import re
import secrets
import time
from collections.abc import Callable
from typing import Literal, Protocol

from preft_serve.common.domain_errors import Conflict, InvalidRequest, NotFound, RateLimited
from preft_serve.common.finetune_wire import (
    FINE_TUNE_PURPOSE,
    MAX_SEQ_LEN,
    METADATA_MAX_KEY,
    METADATA_MAX_PAIRS,
    METADATA_MAX_VALUE,
    SUFFIX_PATTERN,
    CheckpointList,
    EventList,
    FineTuningJob,
    JobCreate,
    JobList,
    JobStatus,
)
from preft_serve.common.text import shown
from preft_serve.registry.finetune.budget import ModelShape, check_fits, check_memory
from preft_serve.registry.finetune.files import FileService, blob_key
from preft_serve.registry.finetune.ids import check_job_id, new_job_id
from preft_serve.registry.finetune.jobs import JobRecord, JobStore
from preft_serve.registry.finetune.resolve import resolve
from preft_serve.registry.finetune.settings import FinetuneSettings
from preft_serve.registry.metrics import RegistryMetrics

logger = logging.getLogger(__name__)


MetadataFilter = dict[str, str] | Literal["null"] | None


def check_metadata(metadata: dict[str, str] | None) -> None:
    """OpenAI's bounds, refused whole before anything is stored."""
    if metadata is None:
        return
    if len(metadata) > METADATA_MAX_PAIRS:
        raise InvalidRequest(
            f"metadata has {len(metadata)} pairs; at most {METADATA_MAX_PAIRS}", param="metadata"
        )
    for key, value in metadata.items():
        if len(key) > METADATA_MAX_KEY:
            raise InvalidRequest(
                f"metadata key {shown(key)} is over {METADATA_MAX_KEY} characters", param="metadata"
            )
        if len(value) > METADATA_MAX_VALUE:
            raise InvalidRequest(
                f"metadata[{shown(key)}] is over {METADATA_MAX_VALUE} characters", param="metadata"
            )


class Canceller(Protocol):
    def cancel_now(self, record: JobRecord) -> None: ...


MAX_LISTED_MODELS = 8  # base model names an unknown ``model``'s 404 lists


@dataclasses.dataclass(frozen=True)
class TrainingFile:
    """What a job needs of one of its files, from the file's stored record."""

    id: str
    param: str
    sha256: str
    examples: int
    longest_line: int | None  # bytes; None if not recorded
    shortest_prompt: int | None  # text bytes before a trained turn; None if not recorded


class FineTuningService:
    def __init__(
        self,
        store: JobStore,
        files: FileService,
        settings: FinetuneSettings,
        base_models: tuple[str, ...],
        max_lora_rank: int,
        max_reft_rank: int,
        model_shape: ModelShape,
        longest_token: int | None,
        canceller: Canceller,
        metrics: RegistryMetrics,
        version_room: Callable[[str, str], None] | None = None,
    ) -> None:
        """``base_models``: the names the base model is served under, as the gateway's
        ``/v1/models`` lists it; ``longest_token``: the most bytes one token of the base
        model stands for (None: no tokenizer to bound prompts with); ``canceller`` stops a
        cancelled job's running trainer (the dispatcher); ``version_room`` refuses a job
        whose adapter keeps as many versions as it may (``AdapterService``), before it
        trains for hours to a version that could not be registered."""
        self.store, self.files, self.settings = store, files, settings
        self.base_models, self.model_shape = base_models, model_shape
        self.longest_token = longest_token
        self.max_lora_rank, self.max_reft_rank = max_lora_rank, max_reft_rank
        self.canceller, self.metrics = canceller, metrics
        self.version_room = version_room

    def _check_model(self, model: str) -> None:
        if model in self.base_models:
            return
        listed = ", ".join(repr(name) for name in self.base_models[:MAX_LISTED_MODELS])
        raise NotFound(
            f"model {shown(model)} is not served here; fine-tune the base model, "
            f"named {listed} (GET /v1/models lists it)",
            code="model_not_found",
            param="model",
        )

    def _file(self, tenant: str, file_id: str, param: str) -> TrainingFile:
        info = self.files.info(tenant, file_id, param)  # one read for every field
        if info.get("purpose") != FINE_TUNE_PURPOSE:
            raise InvalidRequest(
                f"file {file_id} has purpose {info.get('purpose')!r}; upload "
                f"training data with purpose '{FINE_TUNE_PURPOSE}'",
                param=param,
            )
        longest = int(info["longest_line"]) if info.get("longest_line") else None
        shortest = int(info["shortest_prompt"]) if info.get("shortest_prompt") else None
        return TrainingFile(
            file_id, param, info["sha256"], int(info.get("examples", "0")), longest, shortest
        )

    def create(self, tenant: str, body: JobCreate, actor: str | None = None) -> FineTuningJob:
        check_metadata(body.metadata)
        if body.integrations:
            raise InvalidRequest(
                "integrations are not supported here (nothing would receive "
                "them); send none, and follow the job's events instead",
                param="integrations",
                code="unsupported_parameter",
            )
        self._check_model(body.model)
        if body.suffix is not None and re.fullmatch(SUFFIX_PATTERN[1:-1], body.suffix) is None:
            raise InvalidRequest(
                f"suffix {shown(body.suffix)} is invalid: 1-40 letters, digits, "
                "'.', '_' or '-', starting with a letter or digit, no '..'",
                param="suffix",
            )
        training = self._file(tenant, body.training_file, "training_file")
        files = [training]
        if body.validation_file is not None:
            files.append(self._file(tenant, body.validation_file, "validation_file"))
        longests = [f.longest_line for f in files]
        longest = None if None in longests else max(n or 0 for n in longests)
        seed = body.seed if body.seed is not None else secrets.randbelow(2**31)
        options, hyper, method = resolve(
            body,
            training.examples,
            seed,
            self.settings.max_steps,
            self.max_lora_rank,
            self.max_reft_rank,
        )
        for file in files:  # the trainer refuses a validation file it keeps nothing of too
            check_fits(
                file.id,
                file.param,
                options["max_seq_len"],
                MAX_SEQ_LEN,
                file.shortest_prompt,
                self.longest_token,
            )
        check_memory(
            self.model_shape,
            options["batch_size"],
            options["max_seq_len"],
            longest,
            self.settings.memory_limit(),
        )
        job_id = new_job_id()
        job = FineTuningJob(
            id=job_id,
            created_at=int(time.time()),
            model=body.model,
            organization_id=tenant,
            status=JobStatus.QUEUED,
            training_file=body.training_file,
            validation_file=body.validation_file,
            hyperparameters=hyper,
            seed=seed,
            method=method,
            user_provided_suffix=body.suffix,
            metadata=body.metadata,
        )
        record = JobRecord(
            job=job,
            tenant=tenant,
            adapter_name=body.suffix or f"ft-{job_id[6:]}",
            training_sha256=training.sha256,
            validation_sha256=files[1].sha256 if len(files) > 1 else None,
            promote=bool(method["preft"]["promote"]),
            actor=actor,
            train_args={
                **options,
                "training_key": blob_key(training.sha256),
                "validation_key": blob_key(files[1].sha256) if len(files) > 1 else None,
            },
        )
        if self.version_room is not None:
            self.version_room(tenant, record.adapter_name)
        limit = self.settings.tenant_max_running + self.settings.tenant_max_queued
        if not self.store.create_limited(
            record,
            limit,
            "Validated training file; job queued",
            keep_finished=self.settings.tenant_max_jobs_kept,
        ):
            raise RateLimited(
                f"this tenant already has {limit} fine-tuning jobs queued or running (at "
                f"most {self.settings.tenant_max_running} run at once and "
                f"{self.settings.tenant_max_queued} wait); retry when one finishes or "
                "cancel one",
                code="rate_limit_exceeded",
            )
        logger.info(
            "tenant %s job %s queued (%s, %d steps)",
            tenant,
            job_id,
            options["adapter"],
            method["preft"]["steps"],
        )
        return job

    def record(self, tenant: str, job_id: str) -> JobRecord:
        check_job_id(job_id)
        record = self.store.get(job_id)
        if record is None or record.tenant != tenant:
            raise NotFound(f"no fine-tuning job {job_id!r} in this tenant", code="job_not_found")
        return record

    def get(self, tenant: str, job_id: str) -> FineTuningJob:
        return self.record(tenant, job_id).job

    def list(
        self, tenant: str, after: str | None, limit: int, metadata: MetadataFilter = None
    ) -> JobList:
        """``metadata``: pairs a job's metadata must hold, or ``"null"``: jobs without."""
        if after is not None:
            check_job_id(after)

        def match(record: JobRecord) -> bool:
            held = record.job.metadata
            if metadata == "null":
                return held is None
            return all((held or {}).get(k) == v for k, v in (metadata or {}).items())

        records, more = self.store.page(tenant, after, limit, match if metadata else None)
        return JobList(data=[r.job for r in records], has_more=more)

    def cancel(self, tenant: str, job_id: str) -> FineTuningJob:
        record = self.record(tenant, job_id)
        if record.status is JobStatus.CANCELLED:
            return record.job

        def change(r: JobRecord) -> JobRecord | None:
            if r.status is JobStatus.CANCELLED:
                return None  # a concurrent cancel won: cancelling is idempotent
            if r.status.finished:
                raise Conflict(
                    f"job {job_id} already {r.status.value}; only queued or "
                    "running jobs can be cancelled",
                    code="job_not_cancellable",
                )
            r.job.status, r.job.finished_at = JobStatus.CANCELLED, int(time.time())
            r.job.estimated_finish = None
            return r

        new = self.store.update(job_id, change, "Job cancelled")
        if new is None:
            return self.record(tenant, job_id).job
        self.metrics.finetune_finished.labels("cancelled").inc()
        if record.status is JobStatus.RUNNING:
            self.canceller.cancel_now(new)
        return new.job

    def events(self, tenant: str, job_id: str, after: str | None, limit: int) -> EventList:
        self.record(tenant, job_id)
        events, more = self.store.events(job_id, after, limit)
        return EventList(data=events, has_more=more)

    def checkpoints(
        self, tenant: str, job_id: str, after: str | None, limit: int
    ) -> CheckpointList:
        found = list(reversed(self.record(tenant, job_id).checkpoints))
        if after is not None:
            ids = [c.id for c in found]
            found = found[ids.index(after) + 1 :] if after in ids else []
        page = found[:limit]
        return CheckpointList(
            data=page,
            has_more=len(found) > limit,
            first_id=page[0].id if page else None,
            last_id=page[-1].id if page else None,
        )
