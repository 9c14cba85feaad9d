"""Gateway configuration: one pydantic-settings class, built once at start-up.

Every field can be set from the environment with the ``PREFT_GATEWAY_`` prefix
(``PREFT_GATEWAY_REDIS_URL``, ``PREFT_GATEWAY_WORKER_URLS='["http://w1:8000"]'`` ...).
"""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    """Everything the gateway needs; there are no secrets (tenant keys live in Redis)."""

    model_config = SettingsConfigDict(env_prefix="PREFT_GATEWAY_", extra="ignore")

    redis_url: str = "redis://127.0.0.1:6379/0"
    namespace: str = Field("preft", pattern=r"^[A-Za-z0-9_.-]{1,32}$",
                           description="The registry's Redis namespace")
    worker_urls: list[str] = Field(min_length=1, description="Static list of worker base URLs")
    base_model_name: str = Field("base", description="What clients call the base model")
    worker_base_model: str | None = Field(
        None, description="The name workers serve the base model under (vLLM's "
        "--served-model-name, else its --model path); defaults to base_model_name")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Request body limit")
    max_tokens_cap: int = Field(4096, ge=1, description="Largest max_tokens accepted")
    load_factor: float = Field(1.25, ge=1.0, description="Bounded-load cap multiplier")
    connect_timeout_s: float = Field(2.0, gt=0)
    read_timeout_s: float = Field(300.0, gt=0)
    metrics_max_adapters: int = Field(
        100, ge=0, description="Adapters labelled by name in metrics; later ones are 'other'")
    models_list_limit: int = Field(1000, ge=1, description="Most adapters /v1/models lists")

    host: str = "127.0.0.1"
    port: int = 8080
    log_level: str = "INFO"
    log_json: bool = False

    @field_validator("worker_urls", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        """Accept a comma-separated string as well as a JSON list (friendlier for env/flags)."""
        if isinstance(value, str) and not value.lstrip().startswith("["):
            return [u.strip() for u in value.split(",") if u.strip()]
        return value

    @field_validator("worker_urls")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"worker URL {url!r} must start with http:// or https://")
        return [u.rstrip("/") for u in value]

    @property
    def worker_model(self) -> str:
        return self.worker_base_model or self.base_model_name
