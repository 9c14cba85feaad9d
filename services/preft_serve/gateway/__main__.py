"""``python -m preft_serve.gateway``: run the gateway HTTP server."""

from __future__ import annotations

import argparse

from preft_serve.common.service_main import (
    add_settings_flags,
    flag_overrides,
    load_settings,
    serve,
)
from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import GatewaySettings

ENV_PREFIX = "PREFT_GATEWAY_"
FLAGS = (
    "host",
    "port",
    "redis_url",
    "namespace",
    "discovery",
    "worker_urls",
    "worker_dns_name",
    "worker_service",
    "worker_port",
    "tenant_rps",
    "user_rps",
    "tenant_tpm",
    "user_tpm",
    "base_model_name",
    "worker_base_model",
    "max_body_bytes",
    "max_tokens_cap",
    "registry_url",
    "log_json",
    "log_level",
    "tracing_enabled",
    "tracing_exporter",
    "otlp_endpoint",
)
"""Settings that also have a flag (every field is a PREFT_GATEWAY_* variable)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m preft_serve.gateway",
        description="preft-serve gateway: OpenAI-compatible API that picks each request's "
        "adapter from the registry and proxies it to a worker. Configuration comes from "
        "PREFT_GATEWAY_* environment variables (workers: PREFT_GATEWAY_WORKER_URLS as a JSON "
        "or comma list, or DNS / Kubernetes discovery); these flags override them.",
    )
    add_settings_flags(parser, GatewaySettings, ENV_PREFIX, FLAGS, {"worker_urls": "--workers"})
    args = parser.parse_args(argv)
    overrides = flag_overrides(args, FLAGS)
    settings = load_settings(parser, GatewaySettings, overrides, ENV_PREFIX)
    return serve(settings, create_app)


if __name__ == "__main__":
    raise SystemExit(main())
