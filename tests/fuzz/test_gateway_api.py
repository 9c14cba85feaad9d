"""Property-based fuzzing of the gateway's HTTP API from its own OpenAPI document.

The gateway runs under uvicorn on the session's real Redis, where the registry app has
put two tenants (``acme``, ``globex``), their adapters and bound users; its worker is
``bench.fake_worker`` (an instant OpenAI-shaped answer, JSON or SSE), so 2xx paths
are cheap. ``globex`` has token and request rate limits (from the registry, as an operator
would set them) so 429s occur; ``acme`` has none. About half of the generated ``model``
and ``user`` fields are steered to names that exist.

Every case: no 5xx; status, content type and body as documented (schemathesis's checks,
plus every error in the one envelope); the registry's keys never change (the gateway only
reads them); and the rate-limit buckets change only when a request got past the limiter:
a 2xx, or a refusal by adapter selection (404 unknown model / user without a binding,
400 no model and no user), which by design comes after the limiter (docs/gateway.md, "A
request's path") so that unknown names cost the caller like any request. Every other 4xx,
429 included, charges nothing. Buckets are emptied after each case, so each case runs on
the same state and reproduces alone.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import positive_data_acceptance

from bench import fake_worker
from preft_serve.common.objectstore import ObjectStoreSettings
from preft_serve.gateway.app import create_app as create_gateway
from preft_serve.gateway.settings import GatewaySettings
from preft_serve.registry.app import create_app as create_registry
from preft_serve.registry.settings import RegistrySettings
from tests.fuzz.support import (
    TALLY,
    TENANTS,
    RedisState,
    base_model,
    case_hash,
    diff,
    fuzz_settings,
    lora_files,
    steer,
    swap_in_key,
    upload_parts,
)
from tests.support.inprocess import serving

ADMIN_TOKEN = "fuzz-admin-0123456789abcdef"
BASE = "tiny-llama"
# Routes whose valid bodies are not all servable (see test_gateway_api).
NOT_SCHEMA_BOUND = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/detokenize")
STEER = {
    "model": ["support-bot", "bot2", BASE, "nobody"],
    "user": ["alice", "bob", "carol", "dave"],
}
BELOW_CAPS = {
    "max_tokens": 64,
    "max_completion_tokens": 64,
    "max_output_tokens": 64,
    "n": 2,
    "best_of": 2,
}


@dataclass
class Gateway:
    url: str
    keys: dict[str, str]
    redis: RedisState


def _settings(**fields: Any) -> GatewaySettings:
    return GatewaySettings(
        **{"worker_urls": ["http://127.0.0.1:9"], "base_model_name": BASE, **fields}
    )


def _openapi() -> dict[str, Any]:
    """The gateway's OpenAPI document (the fixture checks the running one serves it)."""
    return create_gateway(_settings()).openapi()


# Files, fine-tuning, the audit log, adapters, user bindings, usage and keys are the
# registry's, fuzzed there (test_registry_api.py); the gateway only forwards them
# (tests/gateway/test_registry_forwarding.py, test_tenant_forwarding.py), and deleting a
# model is the registry's adapter deletion (tests/finetune/test_fine_tuned_models.py).
schema = (
    schemathesis.openapi.from_dict(_openapi())
    .exclude(path_regex=r"^/v1/(files|fine_tuning|audit|adapters|users|usage|keys)")
    .exclude(method="DELETE", path="/v1/models/{model}")
)


@schema.hook
def map_case(context: Any, case: Any) -> Any:
    """Steer ``model`` and ``user`` in bodies that were generated valid, and in 3 of 4 of
    them bring the output-token fields under the caps, so that 2xx paths are reached."""
    if isinstance(case.body, dict) and not case.meta.is_negative_at(ParameterLocation.BODY):
        body = case.body
        for name, choices in STEER.items():
            if isinstance(body.get(name), str) and (choice := steer(body[name], choices)):
                body[name] = choice
        if case_hash(case) % 4:
            for name, cap in BELOW_CAPS.items():
                if isinstance(body.get(name), int) and not isinstance(body[name], bool):
                    body[name] = body[name] % cap + 1
            if isinstance(body.get("prompt"), list) and len(body["prompt"]) > 1:
                body["prompt"] = body["prompt"][:2]
    return case


@schema.auth(refresh_interval=None, retry_on=[])
class Credentials:
    """One of the two tenants' keys (by the case's content), as a placeholder."""

    def get(self, case: Any, ctx: Any) -> str | None:
        security = ctx.operation.definition.raw.get("security") or []
        return f"@{TENANTS[case_hash(case) % 2]}" if security else None

    def set(self, case: Any, data: str | None, ctx: Any) -> None:
        if data is not None:
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture(scope="module")
def gateway(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("fuzz-gateway")
    namespace = f"fg{uuid.uuid4().hex[:10]}"
    registry_settings = RegistrySettings(
        admin_token=ADMIN_TOKEN,
        redis_url=redis_server,
        namespace=namespace,
        base_model=base_model(root / "model"),
        base_model_name=BASE,
        staging_dir=root,
        object_store=ObjectStoreSettings(url=str(root / "objects")),
    )
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    keys = {}
    with TestClient(create_registry(registry_settings)) as registry:
        for tenant in TENANTS:
            made = registry.post("/v1/tenants", json={"name": tenant}, headers=admin)
            assert made.status_code == 201, made.text
            keys[tenant] = made.json()["api_key"]
        for tenant, name, seed in (
            ("acme", "support-bot", 1),
            ("acme", "bot2", 2),
            ("globex", "support-bot", 3),
        ):
            resp = registry.post(
                "/v1/adapters",
                data={"name": name, "mode": "prefill"},
                files=upload_parts(*lora_files(seed)),
                headers={"Authorization": f"Bearer {keys[tenant]}"},
            )
            assert resp.status_code == 201, resp.text
        for tenant, user, adapter in (
            ("acme", "alice", "support-bot"),
            ("acme", "carol", "bot2"),
            ("globex", "bob", "support-bot"),
        ):
            resp = registry.put(
                f"/v1/users/{user}",
                json={"adapter": adapter},
                headers={"Authorization": f"Bearer {keys[tenant]}"},
            )
            assert resp.status_code == 200, resp.text
        resp = registry.put(
            "/v1/tenants/globex/limits",
            headers=admin,
            json={"tenant_rps": 100, "user_rps": 20, "tenant_tpm": 300, "user_tpm": 100},
        )
        assert resp.status_code == 200, resp.text
    with serving(fake_worker.app) as worker:
        settings = _settings(
            redis_url=redis_server,
            namespace=namespace,
            worker_urls=[worker],
            max_tokens_cap=256,
            max_request_tokens=2048,
        )
        with serving(create_gateway(settings)) as url:
            yield Gateway(url, keys, RedisState(redis_server, namespace))
    RedisState(redis_server, namespace).restore({})


def _buckets(snapshot: dict[bytes, bytes]) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
    """(registry keys, rate-limit bucket keys) of a namespace snapshot. Usage counters are
    left out: the gateway adds to them in the background after a served request, so one
    may land during a later case (tests/gateway/test_usage.py checks them)."""
    registry = {
        k: v for k, v in snapshot.items() if b":ratelimit:" not in k and b":usage:" not in k
    }
    return registry, {k: v for k, v in snapshot.items() if b":ratelimit:" in k}


def _past_the_limiter(status: int, content: bytes) -> bool:
    """Whether this answer came from a step after the rate limiter (which charges)."""
    if status < 400:
        return True
    if status not in (400, 404):
        return False
    error = json.loads(content)["error"]
    return error["code"] in ("model_not_found", "adapter_binding_not_found") or (
        error["message"].startswith("say which model")
    )


@schema.parametrize()
@fuzz_settings()
def test_gateway_api(case: Any, gateway: Gateway) -> None:
    swap_in_key(case, gateway.keys)
    registry_before, buckets_before = _buckets(gateway.redis.snapshot())
    # Whether a valid body is served depends on more than its schema: the output-token
    # budget spans three fields and the operator's caps, and names must exist; a token id
    # is an integer the vocabulary holds, which JSON Schema cannot say (its "integer"
    # admits 415.0, and the vocabulary's size is the model's).
    excluded = [positive_data_acceptance] if case.operation.path in NOT_SCHEMA_BOUND else []
    response = case.call_and_validate(base_url=gateway.url, timeout=30, excluded_checks=excluded)
    TALLY[("gateway", f"{case.method} {case.operation.path}", response.status_code)] += 1
    registry_after, buckets_after = _buckets(gateway.redis.snapshot())
    assert registry_after == registry_before, diff(registry_before, registry_after)
    if not _past_the_limiter(response.status_code, response.content):
        # A bucket that filled up again may expire meanwhile; none may be charged.
        changed = [d for d in diff(buckets_before, buckets_after) if not d.startswith("removed")]
        assert not changed, changed
    if buckets_after:
        gateway.redis.client.delete(*buckets_after)
