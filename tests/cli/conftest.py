"""The CLI tests' live registry: the registry tests' fixtures (a real uvicorn server on
loopback, over the session's Redis and S3 servers), shared rather than copied."""

from __future__ import annotations

from tests.registry.conftest import (  # noqa: F401  (fixtures, found by name)
    base_model_dir,
    bucket,
    live_server,
    lora_dir,
    namespace,
    s3,
    settings,
)
from tests.support.cli import config_home  # noqa: F401  (autouse: a config dir per test)
