"""Per-tenant rate-limit overrides: the one declaration of their fields.

The registry stores them (``PUT /v1/tenants/{tenant}/limits``, a Redis hash at
``RegistryKeys.tenant_rate_limits``) and the gateway reads them over its own defaults
(``PREFT_GATEWAY_TENANT_RPS`` ...); both take the field names from :data:`RATE_LIMIT_FIELDS`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, ValidationInfo, field_validator


def integral_float_to_int(value: Any) -> Any:
    """JSON has one number type: ``5.0`` is the integer 5 (JSON Schema's ``integer`` admits
    it too), for strict integer fields that still refuse ``5.5``, ``"5"`` and ``true``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class TenantRateLimits(BaseModel):
    """Rate-limit overrides for one tenant; a field left null uses the gateway's default
    (``PREFT_GATEWAY_TENANT_RPS`` ...), and 0 turns that limit off for this tenant.

    Fields are strict: JSON ``true`` or ``"5"`` is refused, not read as 1 or 5 (the stored
    strings are read back with ``model_validate_strings``); a burst of ``5.0`` is 5, ``5.5``
    is refused."""

    model_config = {"extra": "forbid"}

    tenant_rps: float | None = Field(
        None, ge=0, le=1e6, strict=True, description="Requests/s for the whole tenant"
    )
    tenant_burst: int | None = Field(
        None, ge=0, le=10**7, strict=True, description="Tenant bucket size (0 = 2 x rate)"
    )
    user_rps: float | None = Field(
        None, ge=0, le=1e6, strict=True, description="Requests/s per user"
    )
    user_burst: int | None = Field(
        None, ge=0, le=10**7, strict=True, description="User bucket size (0 = 2 x rate)"
    )
    tenant_tpm: float | None = Field(
        None,
        ge=0,
        le=1e9,
        strict=True,
        description="Output tokens/minute "
        "for the whole tenant (charged up front: prompts x n "
        "x max_tokens)",
    )
    user_tpm: float | None = Field(
        None, ge=0, le=1e9, strict=True, description="Output tokens/minute per user"
    )

    @field_validator("tenant_burst", "user_burst", mode="before")
    @classmethod
    def _integral_float_as_int(cls, value: Any, info: ValidationInfo) -> Any:
        """JSON has one number type: ``5.0`` is the integer 5 (as JSON Schema says too).
        Stored values come back as strings (``model_validate_strings``), read as ints."""
        value = integral_float_to_int(value)
        # pydantic types mode as python|json, but validate_strings runs it as "string".
        if info.mode not in ("python", "json") and isinstance(value, str) and value.isdecimal():
            return int(value)
        return value


RATE_LIMIT_FIELDS: tuple[str, ...] = tuple(TenantRateLimits.model_fields)
"""Names of the override fields, which are also the gateway's settings for the defaults."""
