"""Gateway configuration: one pydantic-settings class, built once at start-up.

Every field can be set from the environment with the ``PREFT_GATEWAY_`` prefix
(``PREFT_GATEWAY_REDIS_URL``, ``PREFT_GATEWAY_WORKER_URLS='["http://w1:8000"]'`` ...).
"""

from __future__ import annotations

import enum
import json
from typing import Annotated, Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from preft_serve.common.service_settings import ServiceSettings
from preft_serve.common.tracing import OtlpProtocol, TracingConfig, TracingExporter


class DiscoveryKind(str, enum.Enum):
    """Worker discovery backends, by name (``preft_serve.gateway.discovery``)."""

    STATIC = "static"
    DNS = "dns"
    KUBERNETES = "kubernetes"


class GatewaySettings(ServiceSettings):
    """Everything the gateway needs; there are no secrets (tenant keys live in Redis)."""

    model_config = SettingsConfigDict(env_prefix="PREFT_GATEWAY_", extra="ignore")

    discovery: DiscoveryKind = Field(
        DiscoveryKind.STATIC,
        description="How workers are found: a static URL list, the A records of a headless "
        "Service, or the Service's EndpointSlices through the Kubernetes API",
    )
    worker_urls: Annotated[list[str], NoDecode] = Field(
        [], description="Static list of worker base URLs (a JSON list or comma-separated)"
    )
    worker_dns_name: str | None = Field(
        None,
        description="dns: the workers' headless "
        "Service name, e.g. preft-worker.ns.svc.cluster.local",
    )
    worker_service: str | None = Field(None, description="kubernetes: the workers' Service")
    worker_k8s_namespace: str | None = Field(
        None, description="kubernetes: the Service's namespace (default: this pod's own)"
    )
    worker_port: int = Field(
        8000,
        ge=1,
        le=65535,
        description="dns/kubernetes: worker port "
        "(kubernetes uses the EndpointSlice port named 'http' if any)",
    )
    worker_scheme: Literal["http", "https"] = "http"
    decode_worker_urls: Annotated[list[str], NoDecode] = Field(
        [],
        description="static: decode-pool workers (started with --role decode). Set, "
        "prefill-only (PreFT) and base-model requests are prefilled on a worker above "
        "(started with --role prefill) and decoded on one of these, which hold no adapter",
    )
    decode_worker_dns_name: str | None = Field(
        None, description="dns: the decode workers' headless Service name (unset: no decode pool)"
    )
    decode_worker_service: str | None = Field(
        None, description="kubernetes: the decode workers' Service (unset: no decode pool)"
    )
    discovery_interval_s: float = Field(5.0, gt=0, description="dns/kubernetes refresh period")
    health_interval_s: float = Field(
        2.0, gt=0, description="Worker /health and residency poll period"
    )
    unhealthy_after: int = Field(
        2,
        ge=1,
        description="Consecutive failed health checks (or "
        "connection failures) before a worker gets no traffic",
    )

    tenant_rps: float = Field(
        0.0,
        ge=0,
        description="Requests per second per tenant (token bucket refill rate); 0 = unlimited",
    )
    tenant_burst: int = Field(0, ge=0, description="Tenant bucket size; 0 = 2 x tenant_rps")
    user_rps: float = Field(
        0.0, ge=0, description="Requests per second per (tenant, user); 0 = unlimited"
    )
    user_burst: int = Field(0, ge=0, description="User bucket size; 0 = 2 x user_rps")
    tenant_tpm: float = Field(
        0.0,
        ge=0,
        description="Output tokens per minute per tenant, "
        "charged up front (max_tokens x n x prompts); 0 = unlimited",
    )
    user_tpm: float = Field(
        0.0,
        ge=0,
        description="Output tokens per minute per (tenant, "
        "user), charged like tenant_tpm; 0 = unlimited",
    )
    limits_cache_s: float = Field(
        10.0,
        ge=0,
        description="How long a tenant's rate-limit "
        "overrides and serving settings (set in the registry) "
        "are cached",
    )
    ratelimit_timeout_s: float = Field(
        0.2,
        gt=0,
        le=5,
        description="Longest wait for the "
        "rate limiter's Redis; past it the request is let "
        "through (fail open) and counted",
    )
    base_model_name: str = Field("base", description="What clients call the base model")
    worker_base_model: str | None = Field(
        None,
        description="The name workers serve the base model under (vLLM's "
        "--served-model-name, else its --model path); defaults to base_model_name",
    )
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Request body limit")
    max_tokens_cap: int = Field(
        4096,
        ge=1,
        description="Largest max_tokens accepted; also what a chat request without max_tokens gets",
    )
    max_request_tokens: int = Field(
        16384,
        ge=1,
        description="Largest total output one "
        "request may ask for: prompts x max(n, best_of) x "
        "max_tokens",
    )
    max_choices: int = Field(16, ge=1, description="Largest n (and best_of) accepted")
    max_prompts: int = Field(16, ge=1, description="Most prompts in one /v1/completions request")
    max_prompt_token_ids: int = Field(32768, ge=1, description="Longest token-id prompt")
    max_json_depth: int = Field(
        64,
        ge=2,
        le=1000,
        description="Deepest nesting of JSON arrays/objects accepted in a request body",
    )
    tool_calling: bool = Field(
        False,
        description="The workers run with a tool-call parser (vLLM's "
        "--enable-auto-tool-choice --tool-call-parser; the chart's worker.toolCallParser). "
        "Off, /v1/responses refuses 'tools' and 'tool_choice' with 400 "
        "tool_calling_disabled, as the workers' chat completions do: vLLM's Responses "
        "server would answer such a request in plain text",
    )
    registry_cache_entries: int = Field(
        20_000,
        ge=1,
        description="Entries per registry lookup cache (user bindings, "
        "adapters, API keys); a worst-case entry takes about 1 KiB",
    )
    load_factor: float = Field(1.25, ge=1.0, description="Bounded-load cap multiplier")
    cap_on_worker_load: bool = Field(
        True,
        description="Hold the bounded-load cap against each worker's own running + "
        "waiting requests (vLLM's /metrics, read every load_poll_interval_s: every gateway "
        "replica's requests) rather than this gateway's alone. Off, each replica caps its "
        "own share, and with several replicas a hot worker fills to every replica's cap at "
        "once (docs/scale.md)",
    )
    load_poll_interval_s: float = Field(
        0.25,
        gt=0,
        description="How often each worker's load is read (its /metrics) when "
        "cap_on_worker_load is on: the others' requests the cap counts are this old at most",
    )
    hot_replicas: int = Field(
        32,
        ge=1,
        le=1024,
        description="Most workers one hot adapter is spread over; 1 = "
        "off. The gateway measures each adapter's share of its requests (over about the last "
        "4096) and gives one whose share s exceeds what one worker should carry the first "
        "ceil(s x workers / hot_headroom) workers of its rendezvous order, each request "
        "going to the least loaded of them (docs/scale.md)",
    )
    hot_headroom: float = Field(
        0.05,
        gt=0,
        description="Share of a worker's mean load one hot adapter may "
        "take on each of its replicas: lower spreads hot adapters over more workers, so no "
        "worker reaches the load cap because of one adapter",
    )
    tenant_cold_loads: int = Field(
        32,
        ge=0,
        description="Most requests of one tenant this gateway has open at once on "
        "workers that have not reported their adapter loaded (each fetches it from the "
        "object store first); more get 429 too_many_cold_loads, while requests to loaded "
        "adapters and other tenants' pass. 0 = no limit",
    )
    max_open_requests: int = Field(
        1000,
        ge=1,
        description="Most requests this gateway keeps "
        "open to workers at once; more get 503 at once instead "
        "of queueing for a connection (add replicas to serve more)",
    )
    tenant_max_open_requests: int | None = Field(
        None,
        ge=1,
        description="Of max_open_requests, most one tenant may have open at once "
        "(completions, chat, responses and the evaluations that send them; a stream until "
        "it ends); more get 429 too_many_open_requests, so one tenant's streams never hold "
        "every request slot. Default: a quarter of max_open_requests",
    )
    tenant_classic_adapters_per_worker: int = Field(
        3,
        ge=0,
        description="Most adapters applied to every token (mode 'all') one tenant may "
        "have requests open to on one worker, counted by this replica. A request past it "
        "goes to the next worker of its adapter's order, and where every worker is full "
        "gets 429 too_many_classic_adapters, rather than wait at a worker that holds it "
        "back (the workers bound each tenant's classic slots themselves: "
        "PREFT_WORKER_TENANT_CLASSIC_SLOTS, by default half of their classic slots: 3 "
        "of the 6 that --max-loras 8 leaves them). 0 = no limit",
    )
    connect_timeout_s: float = Field(2.0, gt=0)
    read_timeout_s: float = Field(300.0, gt=0)
    metrics_max_adapters: int = Field(
        100, ge=0, description="Adapters labelled by name in metrics; later ones are 'other'"
    )
    metrics_max_tenants: int = Field(
        100, ge=0, description="Tenants labelled by name in metrics; later ones are 'other'"
    )
    usage_timeout_s: float = Field(
        0.5,
        gt=0,
        le=5,
        description="Longest wait for Redis when "
        "writing a request's per-day usage counters (in the "
        "background; past it the write is dropped and counted)",
    )
    models_list_limit: int = Field(1000, ge=1, description="Most adapters /v1/models lists")
    registry_url: str | None = Field(
        None,
        description="The registry's base URL, e.g. http://preft-registry:8081: "
        "/v1/files and /v1/fine_tuning/jobs are forwarded there, so one OpenAI base URL "
        "serves the whole flow; unset: those routes answer 501",
    )
    admin_token: SecretStr | None = Field(
        None,
        description="The registry's admin token (PREFT_REGISTRY_ADMIN_TOKEN): a bearer of "
        "it may read the operator routes (/v1/operator/*, GET /v1/tenants*); unset: "
        "those routes answer 501",
    )
    registry_timeout_s: float = Field(
        120.0,
        gt=0,
        description="Longest wait for the registry's answer to a forwarded "
        "request (an upload is validated before the registry answers)",
    )
    max_upload_bytes: int = Field(
        1 << 30,
        ge=1024,
        description="Body limit of POST /v1/files, which is streamed to "
        "the registry, never buffered here; keep it equal to the registry's "
        "PREFT_REGISTRY_MAX_UPLOAD_BYTES (the registry refuses bigger bodies itself)",
    )
    registry_connections: int = Field(
        100,
        ge=2,
        description="Most connections this gateway opens to the registry; a "
        "forwarded call that finds them all busy for connect_timeout_s gets 503 "
        "registry_busy",
    )
    registry_uploads: int = Field(
        64,
        ge=1,
        description="Most uploads (POST /v1/files) this gateway streams to the "
        "registry at once, all tenants together; must be below registry_connections, so "
        "the rest stay free for other calls. One more gets 503 uploads_busy",
    )
    registry_upload_reserve: int = Field(
        16,
        ge=0,
        description="Of registry_uploads, how many only a tenant with no upload in "
        "progress may take, so tenants that fill their own shares together still leave "
        "room for others; a tenant that already uploads gets 429 for one of them. Must "
        "be below registry_uploads",
    )
    registry_tenant_uploads: int = Field(
        8,
        ge=1,
        description="Most uploads one tenant streams through this gateway at "
        "once; one more gets 429 naming this number",
    )
    registry_tenant_calls: int = Field(
        16,
        ge=1,
        description="Most forwarded files and fine-tuning calls (uploads "
        "included) one tenant has open through this gateway at once, answers still "
        "streaming included; one more gets 429 naming this number",
    )
    upload_idle_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A forwarded request body that sends nothing for this "
        "long is cut off with 408, freeing its slot and its registry connection",
    )
    upload_min_bytes_per_s: int = Field(
        4096,
        ge=0,
        description="Slowest average rate a forwarded request body may arrive "
        "at once upload_idle_timeout_s has passed (time spent waiting for the registry "
        "not counted); slower is cut off with 408. 0: only the idle timeout",
    )

    # OpenTelemetry (preft_serve.common.tracing; needs the `tracing` extra when on).
    tracing_enabled: bool = Field(
        False,
        description="OpenTelemetry traces: a server span "
        "per request and a client span for the call to the worker, "
        "which gets the W3C traceparent header",
    )
    tracing_exporter: TracingExporter = Field(
        TracingExporter.OTLP,
        description="Where spans go: otlp (a collector at "
        "otlp_endpoint) or console (stdout, for local debugging)",
    )
    otlp_endpoint: str | None = Field(
        None,
        description="OTLP collector, e.g. http://otel-collector:4317 (grpc) or "
        "http://otel-collector:4318/v1/traces (http/protobuf); unset = the exporter's "
        "OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, else localhost",
    )
    otlp_protocol: OtlpProtocol = Field(OtlpProtocol.GRPC, description="OTLP transport")
    tracing_service_name: str = Field(
        "preft-gateway",
        min_length=1,
        max_length=128,
        description="service.name of the gateway's spans",
    )
    tracing_sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of requests "
        "without a traceparent that are traced (a caller's "
        "traceparent decides for its own requests)",
    )

    port: int = Field(8080, ge=1, le=65535, description="Port")

    @field_validator("worker_urls", "decode_worker_urls", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        """Accept a comma-separated string as well as a JSON list (friendlier for env/flags)."""
        if isinstance(value, str):
            if value.lstrip().startswith("["):
                return json.loads(value)
            return [u.strip() for u in value.split(",") if u.strip()]
        return value

    @field_validator("worker_urls", "decode_worker_urls")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"worker URL {url!r} must start with http:// or https://")
        return [u.rstrip("/") for u in value]

    @field_validator("registry_url")
    @classmethod
    def _registry_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"registry URL {value!r} must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("admin_token")
    @classmethod
    def _admin_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        if len(value.get_secret_value()) < 16:
            raise ValueError("admin_token must be at least 16 characters (the registry's)")
        return value

    @model_validator(mode="after")
    def _registry_headroom(self) -> Self:
        if self.registry_uploads >= self.registry_connections:
            raise ValueError(
                f"PREFT_GATEWAY_REGISTRY_UPLOADS ({self.registry_uploads}) must be below "
                f"PREFT_GATEWAY_REGISTRY_CONNECTIONS ({self.registry_connections}): stalled "
                "uploads would otherwise take every connection to the registry"
            )
        if self.registry_upload_reserve >= self.registry_uploads:
            raise ValueError(
                f"PREFT_GATEWAY_REGISTRY_UPLOAD_RESERVE ({self.registry_upload_reserve}) "
                f"must be below PREFT_GATEWAY_REGISTRY_UPLOADS ({self.registry_uploads}): "
                "some upload slots must be open to every tenant"
            )
        return self

    @model_validator(mode="after")
    def _tenant_open_share(self) -> Self:
        if self.tenant_open_share > self.max_open_requests:
            raise ValueError(
                f"PREFT_GATEWAY_TENANT_MAX_OPEN_REQUESTS ({self.tenant_max_open_requests}) "
                f"exceeds PREFT_GATEWAY_MAX_OPEN_REQUESTS ({self.max_open_requests}): one "
                "tenant could hold every request slot"
            )
        return self

    @property
    def tenant_open_share(self) -> int:
        """Requests one tenant may have open: ``tenant_max_open_requests``, else a quarter
        of ``max_open_requests`` (at least 1)."""
        return self.tenant_max_open_requests or max(1, self.max_open_requests // 4)

    @model_validator(mode="after")
    def _discovery_source(self) -> Self:
        required = {
            "static": ("worker_urls", "PREFT_GATEWAY_WORKER_URLS (or --workers)"),
            "dns": ("worker_dns_name", "PREFT_GATEWAY_WORKER_DNS_NAME"),
            "kubernetes": ("worker_service", "PREFT_GATEWAY_WORKER_SERVICE"),
        }
        field, name = required[self.discovery.value]
        if not getattr(self, field):
            raise ValueError(f"{name} is required when discovery is '{self.discovery.value}'")
        return self

    @property
    def has_decode_pool(self) -> bool:
        """Whether a decode pool is configured for the discovery kind in use."""
        field = {
            "static": "decode_worker_urls",
            "dns": "decode_worker_dns_name",
            "kubernetes": "decode_worker_service",
        }[self.discovery.value]
        return bool(getattr(self, field))

    @property
    def worker_model(self) -> str:
        return self.worker_base_model or self.base_model_name

    @property
    def tracing(self) -> TracingConfig:
        """The tracing settings (probes and /metrics are never traced)."""
        return TracingConfig(
            service_name=self.tracing_service_name,
            exporter=self.tracing_exporter,
            otlp_endpoint=self.otlp_endpoint,
            otlp_protocol=self.otlp_protocol,
            sample_ratio=self.tracing_sample_ratio,
            excluded_paths=("/healthz", "/readyz", "/metrics"),
        )
