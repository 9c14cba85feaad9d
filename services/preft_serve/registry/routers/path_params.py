"""The routes' path parameters and list cursors, documented with the naming rules' patterns
(``names.py``), and the page size the lists share.

The pattern reaches the OpenAPI document only: each route still checks the name with
``names.check_*`` (400 with a message), never by schema (422).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

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

PageLimit = Annotated[int, Query(ge=1, le=1000)]
AdapterCursor = Annotated[
    str | None,
    Query(
        description="next_cursor of the previous page",
        json_schema_extra={"pattern": ADAPTER_PATTERN},
    ),
]
UserCursor = Annotated[
    str | None,
    Query(
        description="next_cursor of the previous page (a user id)",
        json_schema_extra={"pattern": USER_PATTERN},
    ),
]
