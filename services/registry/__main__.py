"""``python -m preft_serve.registry``: run the registry HTTP server."""

from __future__ import annotations

import argparse

from preft_serve.common.service_main import load_settings, serve
from preft_serve.registry.app import create_app
from preft_serve.registry.settings import RegistrySettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m preft_serve.registry",
        description="preft-serve adapter registry: tenants upload, validate, version and bind "
        "adapters. Configuration comes from PREFT_REGISTRY_* environment variables "
        "(required: PREFT_REGISTRY_ADMIN_TOKEN, PREFT_REGISTRY_BASE_MODEL; see "
        "docs/registry.md); these flags override them.",
    )
    parser.add_argument("--host", help="bind address (PREFT_REGISTRY_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (PREFT_REGISTRY_PORT, default 8081)")
    parser.add_argument("--base-model", help="base model directory (PREFT_REGISTRY_BASE_MODEL)")
    parser.add_argument("--redis-url", help="PREFT_REGISTRY_REDIS_URL")
    parser.add_argument("--object-store", help="s3://bucket/prefix or a directory "
                        "(PREFT_REGISTRY_OBJECT_STORE__URL)")
    parser.add_argument("--log-json", action="store_true", default=None,
                        help="log one JSON object per line (PREFT_REGISTRY_LOG_JSON)")
    parser.add_argument("--log-level", help="PREFT_REGISTRY_LOG_LEVEL (default INFO)")
    args = parser.parse_args(argv)
    overrides = {
        "host": args.host, "port": args.port, "base_model": args.base_model,
        "redis_url": args.redis_url, "log_json": args.log_json, "log_level": args.log_level,
    }
    if args.object_store:
        overrides["object_store"] = {"url": args.object_store}
    settings = load_settings(parser, RegistrySettings, overrides, "PREFT_REGISTRY_")
    return serve(settings, create_app)


if __name__ == "__main__":
    raise SystemExit(main())
