"""``python -m preft_serve.gateway``: run the gateway HTTP server."""

from __future__ import annotations

import argparse

from preft_serve.common.service_main import load_settings, serve
from preft_serve.gateway.app import create_app
from preft_serve.gateway.settings import DiscoveryKind, GatewaySettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m preft_serve.gateway",
        description="preft-serve gateway: OpenAI-compatible API that picks each request's "
        "adapter from the registry and proxies it to a worker. Configuration comes from "
        "PREFT_GATEWAY_* environment variables (workers: PREFT_GATEWAY_WORKER_URLS as a JSON "
        "or comma list, or DNS / Kubernetes discovery); these flags override them.",
    )
    parser.add_argument("--host", help="bind address (PREFT_GATEWAY_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (PREFT_GATEWAY_PORT, default 8080)")
    parser.add_argument("--redis-url", help="the registry's Redis (PREFT_GATEWAY_REDIS_URL)")
    parser.add_argument("--namespace", help="the registry's Redis namespace "
                        "(PREFT_GATEWAY_NAMESPACE, default preft)")
    parser.add_argument("--discovery", choices=[k.value for k in DiscoveryKind],
                        help="how to find workers (PREFT_GATEWAY_DISCOVERY, default static)")
    parser.add_argument("--workers", help="static: comma-separated worker URLs "
                        "(PREFT_GATEWAY_WORKER_URLS)")
    parser.add_argument("--worker-dns-name", help="dns: the workers' headless Service name "
                        "(PREFT_GATEWAY_WORKER_DNS_NAME)")
    parser.add_argument("--worker-service", help="kubernetes: the workers' Service, whose "
                        "EndpointSlices are listed (PREFT_GATEWAY_WORKER_SERVICE)")
    parser.add_argument("--worker-port", type=int, help="dns/kubernetes: worker port "
                        "(PREFT_GATEWAY_WORKER_PORT, default 8000)")
    parser.add_argument("--tenant-rps", type=float, help="requests/s per tenant, 0 = no "
                        "limit (PREFT_GATEWAY_TENANT_RPS; burst: PREFT_GATEWAY_TENANT_BURST)")
    parser.add_argument("--user-rps", type=float, help="requests/s per user, 0 = no limit "
                        "(PREFT_GATEWAY_USER_RPS; burst: PREFT_GATEWAY_USER_BURST)")
    parser.add_argument("--tenant-tpm", type=float, help="output tokens/minute per tenant, "
                        "0 = no limit (PREFT_GATEWAY_TENANT_TPM)")
    parser.add_argument("--user-tpm", type=float, help="output tokens/minute per user, 0 = no "
                        "limit (PREFT_GATEWAY_USER_TPM)")
    parser.add_argument("--base-model-name", help="public name of the base model "
                        "(PREFT_GATEWAY_BASE_MODEL_NAME, default 'base')")
    parser.add_argument("--worker-base-model", help="the workers' name for the base model "
                        "(PREFT_GATEWAY_WORKER_BASE_MODEL)")
    parser.add_argument("--max-body-bytes", type=int, help="PREFT_GATEWAY_MAX_BODY_BYTES")
    parser.add_argument("--max-tokens-cap", type=int, help="PREFT_GATEWAY_MAX_TOKENS_CAP")
    parser.add_argument("--log-json", action="store_true", default=None,
                        help="log one JSON object per line (PREFT_GATEWAY_LOG_JSON)")
    parser.add_argument("--log-level", help="PREFT_GATEWAY_LOG_LEVEL (default INFO)")
    args = parser.parse_args(argv)
    overrides = {
        "host": args.host, "port": args.port, "redis_url": args.redis_url,
        "namespace": args.namespace, "worker_urls": args.workers,
        "discovery": args.discovery, "worker_dns_name": args.worker_dns_name,
        "worker_service": args.worker_service, "worker_port": args.worker_port,
        "tenant_rps": args.tenant_rps, "user_rps": args.user_rps,
        "tenant_tpm": args.tenant_tpm, "user_tpm": args.user_tpm,
        "base_model_name": args.base_model_name, "worker_base_model": args.worker_base_model,
        "max_body_bytes": args.max_body_bytes, "max_tokens_cap": args.max_tokens_cap,
        "log_json": args.log_json, "log_level": args.log_level,
    }
    settings = load_settings(parser, GatewaySettings, overrides, "PREFT_GATEWAY_")
    return serve(settings, create_app)


if __name__ == "__main__":
    raise SystemExit(main())
