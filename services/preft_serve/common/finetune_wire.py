"""Request and response bodies in OpenAI's shapes (files, fine_tuning.job, events): the
wire contract of the fine-tuning API, shared by the registry that serves it and the gateway
that forwards it (which imports nothing else of the registry).

Every tenant-controlled field is bounded here (lengths, ranges, charsets), so nothing
unbounded reaches a Redis key, a log line or the trainer's command.
"""

from __future__ import annotations

import enum
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field

from preft_serve.adapters.format import AdapterMode, AdapterType

# The adapter name rule (registry.names.ADAPTER_PATTERN: no "..") within 40 characters.
SUFFIX_PATTERN = r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,39}$"
FINE_TUNE_PURPOSE = "fine-tune"
RESULTS_PURPOSE = "fine-tune-results"
MAX_SEQ_LEN = 32768  # the largest method.preft.max_seq_len a job may ask


Item = TypeVar("Item")


class Page(BaseModel, Generic[Item]):
    """OpenAI's list object: one page of ``data``, ``has_more`` when a later page exists
    (``after``/``limit`` page through it)."""

    object: Literal["list"] = "list"
    data: list[Item]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    status_details: str | None = None


FileList = Page[FileObject]


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class JobStatus(str, enum.Enum):
    VALIDATING_FILES = "validating_files"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


Auto = Literal["auto"]


class Hyperparameters(BaseModel):
    """OpenAI's three knobs; ``auto`` picks the trainer's defaults."""

    model_config = {"extra": "forbid"}

    n_epochs: int | Auto = Field("auto", description="Passes over the data (1-50)")
    batch_size: int | Auto = Field("auto", description="Examples per step (1-256)")
    learning_rate_multiplier: float | Auto = Field(
        "auto", description="Times the adapter type's default learning rate (0 < x <= 100)"
    )

    def checked(self) -> Hyperparameters:
        """Range checks with messages (pydantic unions would give unreadable ones)."""
        for name, low, high in (("n_epochs", 1, 50), ("batch_size", 1, 256)):
            value = getattr(self, name)
            if value != "auto" and (isinstance(value, bool) or not low <= value <= high):
                raise ValueError(f"hyperparameters.{name} must be 'auto' or {low}..{high}")
        lr = self.learning_rate_multiplier
        if lr != "auto" and (isinstance(lr, bool) or not 0 < lr <= 100):
            raise ValueError(
                "hyperparameters.learning_rate_multiplier must be 'auto' or in (0, 100]"
            )
        return self


class PreftMethod(BaseModel):
    """Our extension ``method: {"type": "preft", "preft": {...}}``: which adapter to train,
    and whether the version it becomes is served at once."""

    model_config = {"extra": "forbid"}

    adapter: AdapterType = Field(AdapterType.LORA, description="lora, direft or loreft")
    mode: AdapterMode = Field(AdapterMode.PREFILL, description="LoRA: prefill (PreFT) or all")
    rank: int = Field(8, ge=1, le=128)
    alpha: float | None = Field(None, gt=0, le=4096, description="LoRA alpha (default: rank)")
    target_modules: list[str] | None = Field(
        None, max_length=7, description="LoRA projections (default: all)"
    )
    layers: list[int] | None = Field(None, max_length=256, description="ReFT layers")
    positions: str = Field(
        "prefill",
        max_length=16,
        pattern=r"^(prefill|[fl][0-9]{1,4}"
        r"(\+l[0-9]{1,4})?)$",
        description="ReFT positions",
    )
    steps: int | None = Field(None, ge=1, description="Optimizer steps (overrides n_epochs)")
    max_seq_len: int = Field(1024, ge=16, le=MAX_SEQ_LEN)
    hyperparameters: Hyperparameters | None = None
    promote: bool = Field(
        False,
        strict=True,  # "no" or 0 is a mistake to name, not a value to guess
        description="On success, store the trained version staged (false, the default): the "
        "adapter name keeps serving its current version until POST /v1/adapters/{name}/"
        "versions/{version}/promote (after its evaluation if the name has one) or a serving "
        "policy's canary serves it; or serve it to every user at once (true). An adapter's "
        "first version is always served",
    )


class Method(BaseModel):
    """``supervised`` (OpenAI's; trains a PreFT LoRA unless the top-level ``preft`` says
    otherwise) or ``preft``; the type is read back as sent."""

    model_config = {"extra": "forbid"}

    type: Literal["supervised", "preft"] = "preft"
    preft: PreftMethod | None = None
    supervised: dict[str, Any] | None = Field(
        None, description="OpenAI's shape; only its hyperparameters are read"
    )


METADATA_MAX_PAIRS, METADATA_MAX_KEY, METADATA_MAX_VALUE = 16, 64, 512
"""OpenAI's bounds on ``metadata``."""


class JobCreate(BaseModel):
    model_config = {"extra": "ignore"}  # fields of OpenAI's we do not read (none today)

    model: str = Field(max_length=256, description="The served base model's name")
    training_file: str = Field(max_length=64, description="A file id (purpose fine-tune)")
    validation_file: str | None = Field(None, max_length=64)
    suffix: str | None = Field(
        None,
        max_length=40,
        json_schema_extra={"pattern": SUFFIX_PATTERN},
        description="The trained adapter's name: 1-40 letters, "
        "digits, '.', '_' or '-'; a later job with the same suffix adds a new version",
    )
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    hyperparameters: Hyperparameters | None = None
    method: Method | None = None
    preft: PreftMethod | None = Field(
        None,
        description="PreFT options for method.type "
        "'supervised' (the SDK's extra_body): the SDK's "
        "method types have no room for them",
    )
    # The bounds are in the schema and checked by the service (a 400 that names them).
    metadata: dict[str, str] | None = Field(
        None,
        description="At most 16 pairs; keys up to 64, values up to 512 characters",
        json_schema_extra={
            "maxProperties": METADATA_MAX_PAIRS,
            "propertyNames": {"maxLength": METADATA_MAX_KEY},
            "additionalProperties": {"type": "string", "maxLength": METADATA_MAX_VALUE},
        },
    )
    integrations: list[Any] | None = Field(
        None,
        description="Not supported: a non-empty list is refused",
        json_schema_extra={"maxItems": 0},
    )


class JobError(BaseModel):
    code: str
    message: str
    param: str | None = None


class FineTuningJob(BaseModel):
    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    finished_at: int | None = None
    model: str
    fine_tuned_model: str | None = None
    organization_id: str
    result_files: list[str] = Field(default_factory=list)
    status: JobStatus
    validation_file: str | None = None
    training_file: str
    hyperparameters: dict[str, Any]
    trained_tokens: int | None = None
    error: JobError | None = None
    seed: int
    method: dict[str, Any]
    user_provided_suffix: str | None = None
    estimated_finish: int | None = None
    integrations: list[Any] | None = None
    metadata: dict[str, str] | None = None


JobList = Page[FineTuningJob]


class JobEvent(BaseModel):
    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"] = "info"
    message: str
    data: dict[str, Any] | None = None
    type: Literal["message", "metrics"] = "message"


EventList = Page[JobEvent]


class Checkpoint(BaseModel):
    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    metrics: dict[str, float]
    step_number: int


CheckpointList = Page[Checkpoint]
