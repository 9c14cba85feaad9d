"""Worker-side configuration for loading adapters by content hash (pydantic-settings).

vLLM starts the worker, not us, so the only channel into the plugin is the environment:
``python -m preft_serve.worker.serve --object-store ...`` sets these variables before it
``exec``s vLLM, and :func:`preft_serve.worker.plugin.register` reads them. The resolver is
off unless ``PREFT_WORKER_OBJECT_STORE_URL`` is set, so a plain PreFT worker is unchanged.
S3 credentials come from boto3's usual sources (``AWS_ACCESS_KEY_ID``, an instance role...),
never from these settings, so they never appear in a process listing.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from preft_serve.common.objectstore import ObjectStore, create_object_store, parse_store_url
from preft_serve.common.service_settings import NAMESPACE_PATTERN
from preft_serve.worker.adapter_tiers.background_parse import GilYield

ENV_PREFIX = "PREFT_WORKER_"


class WorkerSettings(BaseSettings):
    """Object store and local disk cache of the hash-addressed adapter resolver."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    object_store_url: str | None = Field(
        None, description="s3://bucket[/prefix], file:///dir or a path; unset = resolver off"
    )
    s3_endpoint_url: str | None = Field(None, description="S3-protocol endpoint (MinIO, moto)")
    s3_region: str | None = None
    adapter_cache_dir: Path = Field(
        Path("var/worker/adapter-cache"), description="Local disk LRU of adapter directories"
    )
    adapter_cache_bytes: int = Field(10 << 30, ge=1 << 20, description="Disk cache budget in bytes")
    registry_redis_url: str | None = Field(
        None,
        description="The registry's Redis; set = prefetch new versions of adapters "
        "this worker holds as soon as they are published",
    )
    registry_namespace: str = Field("preft", pattern=NAMESPACE_PATTERN)
    resolver_threads: int = Field(
        2,
        ge=1,
        le=64,
        description="Adapters downloaded and "
        "verified at once (low-priority threads, off the event loop)",
    )
    preload_pause_us: int = Field(
        200,
        ge=0,
        le=10_000,
        description="How long a background adapter parse hands the "
        "GIL back to the model step, every few hundred interpreter events (see "
        "preft_serve.worker.adapter_tiers.background_parse.GilYield); 0 = it holds the GIL "
        "as long as CPython lets it",
    )

    adapter_hold_ms: int = Field(
        2000,
        ge=0,
        le=60_000,
        description="Longest the scheduler holds a waiting request "
        "back while its adapter is parsed in the background, so that no step parses "
        "inline (see preft_serve.worker.adapter_tiers.parse_gate); 0 = never hold: schedule "
        "at once and parse in the step, as stock vLLM does",
    )

    prefill_reserved_slots: int | None = Field(
        None,
        ge=0,
        le=1024,
        description="Adapter slots (of --max-loras) that adapters applied to every token "
        "may not take, so a prefill-only adapter always finds one while classic adapters "
        "decode (they keep theirs until their request ends; see "
        "preft_serve.worker.decode_slots); unset = a quarter of --max-loras, at least 1 "
        "where it is 2 or more; 0 = none, as stock vLLM",
    )

    tenant_classic_slots: int | None = Field(
        None,
        ge=0,
        le=1024,
        description="Of the slots adapters applied to every token may take, how many one "
        "tenant's may hold at once (the tenant the gateway names in the request), so one "
        "tenant's long answers cannot hold every classic slot; unset = half of them, at "
        "least 1; 0 = no per-tenant limit",
    )

    def preload_share_gil(self) -> GilYield | None:
        return GilYield(pause_s=self.preload_pause_us / 1e6) if self.preload_pause_us else None

    @field_validator("object_store_url")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        if value:
            parse_store_url(value)  # raises with the list of valid schemes
        return value or None

    @property
    def resolver_enabled(self) -> bool:
        return self.object_store_url is not None

    def create_store(self) -> ObjectStore:
        if self.object_store_url is None:
            raise ValueError(f"{ENV_PREFIX}OBJECT_STORE_URL is not set")
        return create_object_store(
            self.object_store_url, endpoint_url=self.s3_endpoint_url, region=self.s3_region
        )
