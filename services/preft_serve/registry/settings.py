"""Registry configuration: one pydantic-settings class, built once at start-up.

Every field can be set from the environment with the ``PREFT_REGISTRY_`` prefix
(``PREFT_REGISTRY_ADMIN_TOKEN``, ``PREFT_REGISTRY_OBJECT_STORE__URL`` ...).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BeforeValidator,
    ByteSize,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import SettingsConfigDict

from preft_serve.common.objectstore import ObjectStoreSettings
from preft_serve.common.rank_caps import RANK_CAPS, REFT_KERNEL_MAX_RANK
from preft_serve.common.service_settings import ServiceSettings
from preft_serve.registry.finetune.settings import FinetuneSettings
from preft_serve.registry.transfers import EXPORT_SLACK_BYTES

_PLACEHOLDERS = (
    "changeme",
    "change-me",
    "change_me",
    "secret",
    "password",
    "admin",
    "token",
    "example",
    "xxx",
    "todo",
    "replace",
)
DType = Literal["F32", "F16", "BF16"]
_KUBERNETES_BINARY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGTP]i)\s*")


def _kubernetes_quantity(value: Any) -> Any:
    """Kubernetes' binary suffixes (``6Gi``, as the chart's volume sizes are written) read
    as pydantic's ``GiB``; plain numbers and ``6GiB`` / ``6GB`` pass through."""
    if isinstance(value, str) and (found := _KUBERNETES_BINARY.fullmatch(value)):
        return f"{found[1]}{found[2]}B"
    return value


Bytes = Annotated[ByteSize, BeforeValidator(_kubernetes_quantity)]
"""A byte count: ``6442450944``, ``6Gi``, ``6GiB`` or ``6GB``."""


class RegistrySettings(ServiceSettings):
    """Everything the registry needs; secrets have no default."""

    model_config = SettingsConfigDict(
        env_prefix="PREFT_REGISTRY_",
        env_nested_delimiter="__",
        extra="ignore",
        populate_by_name=True,
    )

    admin_token: SecretStr = Field(description="Bearer token for admin endpoints (>= 16 chars)")
    object_store: ObjectStoreSettings = ObjectStoreSettings(url="var/registry/objects")
    base_model: Path = Field(description="Base model directory (or its config.json)")
    base_model_name: str | None = Field(
        None, description="Label for the base model; defaults to the directory name"
    )

    # Defaults shared with the workers (common/rank_caps.py); keep them equal to the
    # workers' --max-lora-rank, or uploads pass here and fail on every request there.
    max_lora_rank: int = Field(
        RANK_CAPS.max_lora_rank,
        ge=1,
        validation_alias=AliasChoices("PREFT_REGISTRY_MAX_LORA_RANK", "PREFT_REGISTRY_MAX_RANK"),
        description="Largest LoRA r: the workers' --max-lora-rank (MAX_RANK is the old name)",
    )
    max_reft_rank: int = Field(
        RANK_CAPS.max_reft_rank,
        ge=1,
        le=REFT_KERNEL_MAX_RANK,
        description="Largest ReFT rank (the GPU kernel's limit at most)",
    )
    allowed_dtypes: tuple[DType, ...] = ("F32", "F16", "BF16")
    max_upload_bytes: int = Field(1 << 30, ge=1024, description="Whole request body")
    max_weights_bytes: int = Field(1 << 30, ge=1024, description="adapter_model.safetensors")
    max_config_bytes: int = Field(1 << 20, ge=1024, description="adapter_config.json")
    max_archive_members: int = Field(16, ge=2)
    max_compression_ratio: float = Field(
        100.0, gt=1.0, description="Uncompressed/compressed, per archive member"
    )
    tenant_max_adapters: int = Field(
        1000,
        ge=1,
        description="Adapters one tenant may hold; "
        "an upload creating one more is refused (403 "
        "quota_exceeded)",
    )
    tenant_max_stored_bytes: int = Field(
        10 << 30,
        ge=1024,
        description="Bytes of distinct "
        "adapter content (all versions) one tenant may "
        "store; an upload going over is refused (403 "
        "quota_exceeded)",
    )
    max_versions_per_adapter: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="Versions one adapter keeps (uploads, rollbacks and fine-tuned versions "
        "each add one); one more is refused (403 quota_exceeded): upload under a new name, "
        "or delete the adapter and upload it again",
    )
    tenant_max_users: int = Field(
        100_000,
        ge=1,
        description="Users one tenant may bind to adapters (each binding is kept in Redis); "
        "binding one more new user is refused (403 quota_exceeded), rebinding a bound one "
        "is not",
    )
    tenant_max_keys: int = Field(
        1000,
        ge=1,
        description="API keys one tenant may hold (revoked keys are deleted and do not "
        "count; expired ones do until revoked); POST /v1/keys creating one more is refused "
        "(409 key_limit_reached)",
    )
    staging_dir: Path | None = Field(
        None, description="Where uploads are unpacked; defaults to the system temp dir"
    )
    max_transfers: int = Field(
        8,
        ge=1,
        le=10000,
        description="Uploads and downloads one replica serves at once (each holds scratch "
        "disk while it runs); one more is refused (503 registry_busy, Retry-After)",
    )
    tenant_max_transfers: int = Field(
        2,
        ge=1,
        le=10000,
        description="Uploads and downloads one tenant runs at once on one replica, at most "
        "max_transfers; one more is refused (429 too_many_transfers, Retry-After)",
    )
    scratch_bytes: Bytes = Field(
        ByteSize(6 << 30),
        gt=0,
        description="Scratch disk the replica's uploads and downloads in progress may hold "
        "at once (spooled bodies, staged files, download archives, counted as written; "
        "accepts 6Gi): past it, 503 registry_busy with Retry-After. Keep it under the "
        "staging volume's size: Kubernetes evicts a pod whose emptyDir passes its sizeLimit",
    )
    tenant_scratch_bytes: Bytes | None = Field(
        None,
        gt=0,
        description="Of scratch_bytes, what one tenant's transfers may hold at once (429 "
        "too_many_transfers past it); must fit one full-size upload or download. "
        "Default: half of scratch_bytes",
    )
    transfer_idle_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="An upload whose body sends nothing, or a download whose client reads "
        "nothing, for this long is cut off (an upload with 408), freeing its transfer slot",
    )
    transfer_min_bytes_per_s: int = Field(
        4096,
        ge=0,
        description="Slowest average rate an upload's body may arrive, or a download be "
        "read, once transfer_idle_timeout_s has passed; slower is cut off (an upload with "
        "408). 0: only the idle timeout",
    )
    events_maxlen: int = Field(1_000_000, ge=1000, description="Approximate event stream cap")
    audit_max_entries: int = Field(
        10_000,
        ge=10,
        le=10_000_000,
        description="Audit log entries kept per tenant (the oldest go first)",
    )
    audit_max_entries_all: int = Field(
        1_000_000,
        ge=10,
        le=100_000_000,
        description="Audit log entries kept in the registry-wide stream the operator reads",
    )
    audit_max_age_s: int = Field(
        90 * 86400,
        ge=60,
        description="Audit log entries older than this are dropped and never served",
    )
    finetune: FinetuneSettings = Field(
        default_factory=FinetuneSettings, description="Fine-tuning jobs (docs/fine-tuning.md)"
    )

    port: int = Field(8081, ge=1, le=65535, description="Port")

    @field_validator("admin_token")
    @classmethod
    def _real_secret(cls, value: SecretStr) -> SecretStr:
        raw = value.get_secret_value()
        if len(raw) < 16:
            raise ValueError("admin_token must be at least 16 characters (use a random secret)")
        if any(p in raw.lower() for p in _PLACEHOLDERS) and len(set(raw)) < 12:
            raise ValueError("admin_token looks like a placeholder; set a random secret")
        return value

    @model_validator(mode="after")
    def _tenant_share(self) -> RegistrySettings:
        if self.tenant_max_transfers > self.max_transfers:
            raise ValueError(
                f"tenant_max_transfers ({self.tenant_max_transfers}) exceeds max_transfers "
                f"({self.max_transfers}): one tenant could hold every transfer slot"
            )
        share = self.tenant_scratch_share
        if share > self.scratch_bytes:
            raise ValueError(
                f"tenant_scratch_bytes ({share}) exceeds scratch_bytes "
                f"({self.scratch_bytes}): one tenant could hold all the scratch disk"
            )
        if share < self.largest_transfer_bytes:
            raise ValueError(
                f"tenant_scratch_bytes ({share}"
                f"{'' if self.tenant_scratch_bytes else ', half of scratch_bytes'}) is less "
                f"than one full-size transfer holds ({self.largest_transfer_bytes} bytes: "
                f"max_upload_bytes of spooled body and the adapter's files unpacked, or a "
                f"download's files and archive): raise scratch_bytes (and "
                f"tenant_scratch_bytes), or lower max_upload_bytes / max_weights_bytes"
            )
        return self

    @property
    def tenant_scratch_share(self) -> int:
        """What one tenant's transfers may hold: ``tenant_scratch_bytes``, else half of
        ``scratch_bytes``."""
        return int(self.tenant_scratch_bytes or self.scratch_bytes // 2)

    @property
    def largest_transfer_bytes(self) -> int:
        """The most scratch one transfer can hold: an upload's whole body spooled and its
        largest unpacked files (or fine-tuning file) staged, or a download's files and
        their archive (:data:`EXPORT_SLACK_BYTES` each beyond the files)."""
        adapter = self.max_weights_bytes + self.max_config_bytes
        training_file = min(self.finetune.max_file_bytes, self.max_upload_bytes)
        upload = self.max_upload_bytes + max(adapter, training_file)
        download = 2 * (adapter + EXPORT_SLACK_BYTES)
        return max(upload, download)

    @field_validator("base_model")
    @classmethod
    def _has_config(cls, value: Path) -> Path:
        config = value / "config.json" if value.is_dir() else value
        if not config.is_file():
            raise ValueError(f"{config} does not exist: point base_model at a HF model directory")
        return value

    @property
    def base_model_config(self) -> Path:
        return self.base_model / "config.json" if self.base_model.is_dir() else self.base_model

    @property
    def base_model_label(self) -> str:
        if self.base_model_name:
            return self.base_model_name
        return (self.base_model if self.base_model.is_dir() else self.base_model.parent).name
