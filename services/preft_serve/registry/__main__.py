"""``python -m preft_serve.registry``: run the registry HTTP server."""

from __future__ import annotations

import argparse

from preft_serve.common.service_main import (
    add_settings_flags,
    flag_overrides,
    load_settings,
    serve,
)
from preft_serve.registry.app import create_app
from preft_serve.registry.settings import RegistrySettings

ENV_PREFIX = "PREFT_REGISTRY_"
FLAGS = (
    "host",
    "port",
    "base_model",
    "redis_url",
    "namespace",
    "max_lora_rank",
    "log_json",
    "log_level",
)
"""Settings that also have a flag (every field is a PREFT_REGISTRY_* variable)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m preft_serve.registry",
        description="preft-serve adapter registry: tenants upload, validate, version and bind "
        "adapters. Configuration comes from PREFT_REGISTRY_* environment variables "
        "(required: PREFT_REGISTRY_ADMIN_TOKEN, PREFT_REGISTRY_BASE_MODEL; see "
        "docs/registry.md); these flags override them.",
    )
    add_settings_flags(parser, RegistrySettings, ENV_PREFIX, FLAGS)
    parser.add_argument(
        "--object-store", help=f"s3://bucket/prefix or a directory ({ENV_PREFIX}OBJECT_STORE__URL)"
    )
    args = parser.parse_args(argv)
    overrides = flag_overrides(args, FLAGS)
    if args.object_store:
        overrides["object_store"] = {"url": args.object_store}
    settings = load_settings(parser, RegistrySettings, overrides, ENV_PREFIX)
    return serve(settings, create_app)


if __name__ == "__main__":
    raise SystemExit(main())
