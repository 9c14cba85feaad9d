"""Request and response bodies of the REST API (what /docs shows)."""

from __future__ import annotations

import datetime

from pydantic import BaseModel, Field

from preft_serve.adapters.format import AdapterMode, AdapterType
from preft_serve.common.key_roles import KeyRole
from preft_serve.common.tenant_serving import DEFAULT_UNBOUND_USER, UnboundUser
from preft_serve.registry.names import ADAPTER_PATTERN, TENANT_PATTERN
from preft_serve.registry.quotas import QuotaOverrides

KEY_ROLES = tuple(r.value for r in KeyRole)  # admin first: the default of old records
KEY_NAME_MAX = 64
KEY_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9 ._@-]{0,63}$"
KEY_MIN_TTL_S = 60
KEY_MAX_TTL_S = 5 * 365 * 86400

# TenantRateLimits (GET/PUT /v1/tenants/{tenant}/limits) is in
# preft_serve.common.tenant_rate_limits: the gateway reads the same fields.


_QUOTA = (
    "The tenant's own storage quotas; a null field uses the registry's default "
    "(PREFT_REGISTRY_TENANT_MAX_ADAPTERS, PREFT_REGISTRY_TENANT_MAX_STORED_BYTES)"
)
_UNBOUND_USER = (
    "What a request naming the base model gets for a user with no adapter "
    "binding: base_model (the base model answers, x-preft-adapter: none) or "
    "not_found (404 adapter_binding_not_found). Gateways apply a change within "
    "PREFT_GATEWAY_LIMITS_CACHE_S seconds"
)


class TenantCreate(BaseModel):
    name: str = Field(
        description="Tenant id: 2-63 lowercase letters, digits or '-'",
        examples=["acme"],
        json_schema_extra={"pattern": TENANT_PATTERN},
    )
    quota: QuotaOverrides | None = Field(None, description=_QUOTA)


class TenantUpdate(BaseModel):
    """``PATCH /v1/tenants/{tenant}``: a JSON merge patch. A quota field given sets that
    override, a null one removes it (back to the default), an absent one is unchanged;
    ``"quota": null`` removes both. ``unbound_user`` likewise (null: the default)."""

    model_config = {"extra": "forbid"}

    quota: QuotaOverrides | None = Field(
        None, description=_QUOTA, examples=[{"max_adapters": 50, "max_stored_bytes": None}]
    )
    unbound_user: UnboundUser | None = Field(
        None, description=_UNBOUND_USER + f"; null: the default, {DEFAULT_UNBOUND_USER.value}"
    )


class ApiKeyCreate(BaseModel):
    """``POST /v1/keys`` (and, optionally, the operator's ``POST /v1/tenants/{t}/keys``).
    At most one of ``expires_at`` and ``ttl_s``; neither: the key does not expire."""

    model_config = {"extra": "forbid"}

    role: str = Field(
        description="admin (everything in the tenant), developer (adapters, users, files, "
        "fine-tuning, usage, inference) or inference (completions, responses, tokenize, "
        "models); at most the creating key's own role",
        json_schema_extra={"enum": list(KEY_ROLES)},
    )
    name: str | None = Field(
        None,
        description=f"A label for people: 1-{KEY_NAME_MAX} letters, digits, spaces or "
        "'.', '_', '@', '-', starting with a letter or digit",
        examples=["ci-deploy"],
        json_schema_extra={"pattern": KEY_NAME_PATTERN, "maxLength": KEY_NAME_MAX},
    )
    expires_at: str | None = Field(
        None,
        description="When the key stops working, RFC 3339 with an offset "
        f"(2027-01-31T12:00:00Z); in the future, at most {KEY_MAX_TTL_S // 86400} days ahead",
        json_schema_extra={"format": "date-time", "maxLength": 64},
    )
    ttl_s: int | None = Field(
        None,
        description="Or: seconds from now until the key stops working",
        json_schema_extra={"minimum": KEY_MIN_TTL_S, "maximum": KEY_MAX_TTL_S},
    )


class ApiKeyInfo(BaseModel):
    """An API key as listed: never its secret nor its hash."""

    key_id: str
    created_at: str
    role: str = Field(KEY_ROLES[0], json_schema_extra={"enum": list(KEY_ROLES)})
    name: str | None = None
    expires_at: str | None = Field(None, description="RFC 3339; null: never")
    last_used_at: str | None = Field(
        None, description="When it last authenticated a request (to the minute); null: never"
    )
    created_by: str | None = Field(
        None, description="The key id that created it, or `operator`; null: not recorded"
    )


class ApiKeyCreated(ApiKeyInfo):
    tenant: str
    api_key: str = Field(description="Shown once; only its hash is stored")


class TenantOut(BaseModel):
    name: str
    created_at: str
    keys: list[ApiKeyInfo]
    quota: QuotaOverrides = Field(default_factory=QuotaOverrides, description=_QUOTA)
    unbound_user: UnboundUser = Field(DEFAULT_UNBOUND_USER, description=_UNBOUND_USER)


class TenantSummary(BaseModel):
    name: str
    created_at: str
    adapters: int
    quota: QuotaOverrides = Field(default_factory=QuotaOverrides, description=_QUOTA)


class TenantDeleted(BaseModel):
    """What ``DELETE /v1/tenants/{tenant}`` removed."""

    name: str
    keys: int = Field(description="API keys revoked")
    adapters: int = Field(description="adapters deleted with their version history")
    bindings: int = Field(description="user bindings removed")
    blobs: int = Field(description="stored contents deleted (no other tenant referenced them)")
    files: int = Field(description="fine-tuning files deleted")
    fine_tuning_jobs: int = Field(description="finished fine-tuning jobs' records deleted")


class TenantCreated(TenantOut):
    api_key: str = Field(description="Shown once; only its hash is stored")
    key_id: str


class AdapterVersion(BaseModel):
    """One immutable version: a label pointing at content."""

    name: str
    version: int
    sha256: str
    type: AdapterType
    rank: int
    mode: AdapterMode
    base_model: str
    size_bytes: int
    created_at: str


class AdapterUploaded(AdapterVersion):
    """The upload response: the stored version plus what validation warns about."""

    warnings: list[str] = Field(
        default_factory=list,
        description=(
            "Accepted but doubtful settings, e.g. a base_model_name_or_path naming another model "
            "or target_modules entries that match nothing; ?strict=true refuses them instead"
        ),
    )


class AdapterOut(AdapterVersion):
    """An adapter's current version plus adapter-level facts."""

    updated_at: str
    bound_users: int


class RollbackIn(BaseModel):
    version: int = Field(
        ge=1, description="The version whose content becomes current again", examples=[1]
    )


class VersionOut(BaseModel):
    version: int
    sha256: str
    type: AdapterType
    rank: int
    mode: AdapterMode
    size_bytes: int
    created_at: str


class AdapterDetail(AdapterOut):
    versions: list[VersionOut]


class AdapterPage(BaseModel):
    items: list[AdapterOut]
    next_cursor: str | None = Field(
        description="Pass as ?cursor= for the next page; null on the last page"
    )


class BindingIn(BaseModel):
    adapter: str = Field(
        description="Name of one of your adapters",
        examples=["support-bot"],
        json_schema_extra={"pattern": ADAPTER_PATTERN},
    )


class BindingOut(BaseModel):
    user: str
    adapter: str
    version: int = Field(
        description="The version this user is served (under a canary split: the user's side of it)"
    )
    sha256: str
    type: AdapterType
    mode: AdapterMode
    variant: str = Field(
        "serving",
        description="Which part of the adapter's serving policy serves this user: serving "
        "or canary",
        json_schema_extra={"enum": ["serving", "canary"]},
    )


class UserBinding(BaseModel):
    user: str
    adapter: str


class UserPage(BaseModel):
    items: list[UserBinding]
    next_cursor: str | None = Field(
        description="Pass as ?cursor= for the next page; null on the last page"
    )


class UsageModel(BaseModel):
    model: str = Field(description="The adapter's name, or the base model's public name")
    requests: int = Field(description="Requests a worker answered with 200")
    prompt_tokens: int
    completion_tokens: int


class UsageDay(BaseModel):
    date: datetime.date = Field(description="The UTC day")
    models: list[UsageModel]


class UsageReport(BaseModel):
    tenant: str
    start: datetime.date
    end: datetime.date
    days: list[UsageDay] = Field(description="Days with any usage, oldest first")
