"""Per-tenant rate-limit overrides: the one declaration of their fields.

The registry stores them (``PUT /v1/tenants/{tenant}/limits``, a Redis hash at
``RegistryKeys.tenant_limits``) and the gateway reads them over its own defaults
(``PREFT_GATEWAY_TENANT_RPS`` ...); both take the field names from :data:`LIMIT_FIELDS`.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class TenantLimits(BaseModel):
    """Rate-limit overrides for one tenant; a field left null uses the gateway's default
    (``PREFT_GATEWAY_TENANT_RPS`` ...), and 0 turns that limit off for this tenant.

    Fields are strict: JSON ``true`` or ``"5"`` is refused, not read as 1 or 5 (the stored
    strings are read back with ``model_validate_strings``)."""

    model_config = {"extra": "forbid"}

    tenant_rps: float | None = Field(None, ge=0, le=1e6, strict=True,
                                     description="Requests/s for the whole tenant")
    tenant_burst: int | None = Field(None, ge=0, le=10**7, strict=True,
                                     description="Tenant bucket size (0 = 2 x rate)")
    user_rps: float | None = Field(None, ge=0, le=1e6, strict=True,
                                   description="Requests/s per user")
    user_burst: int | None = Field(None, ge=0, le=10**7, strict=True,
                                   description="User bucket size (0 = 2 x rate)")
    tenant_tpm: float | None = Field(None, ge=0, le=1e9, strict=True,
                                     description="Output tokens/minute "
                                     "for the whole tenant (charged up front: prompts x n "
                                     "x max_tokens)")
    user_tpm: float | None = Field(None, ge=0, le=1e9, strict=True,
                                   description="Output tokens/minute per user")


LIMIT_FIELDS: tuple[str, ...] = tuple(TenantLimits.model_fields)
"""Names of the override fields, which are also the gateway's settings for the defaults."""
