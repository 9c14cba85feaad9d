"""The routes' path parameters, documented with the naming rules' patterns (``names.py``).

The pattern reaches the OpenAPI document only: each route still checks the name with
``names.check_*`` (400 with a message), never by schema (422).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from preft_serve.registry.names import (
    ADAPTER_PATTERN,
    KEY_ID_PATTERN,
    TENANT_PATTERN,
    USER_PATTERN,
)

TenantPath = Annotated[str, Path(json_schema_extra={"pattern": TENANT_PATTERN})]
AdapterPath = Annotated[str, Path(json_schema_extra={"pattern": ADAPTER_PATTERN})]
UserPath = Annotated[str, Path(json_schema_extra={"pattern": USER_PATTERN})]
KeyIdPath = Annotated[str, Path(json_schema_extra={"pattern": KEY_ID_PATTERN})]
